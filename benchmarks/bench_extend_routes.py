"""The two routes of a prefill over a cached prefix, timed on the GPU, beside the cost model that chooses between them.

    python -m benchmarks.bench_extend_routes --out routes_out          # on the H100 host, runtime active

Per (heads, requests, prefix p, new tokens e), every request holding p + e tokens of a paged cache:
* snapmla absorbed: the backend's absorbed extend (`SnapMLAForward._absorbed_extend` with its launch plan cached, as
  every layer after a batch's first runs it): Q gather + quant, the FP8 decode kernel with s_q = e, scatter;
* snapmla MHA: fetch-dequant of all p + e rows, kv_b_proj (a [rows, 512] x [512, H x 256] BF16 GEMM; with
  `--kv-b-proj fp8` the W8A8 block-FP8 linear SGLang serves an FP8 checkpoint's kv_b_proj with, its activations
  quantized per 128-group, on Triton's kernel where DeepGEMM is off), K assembled from K_nope and the RoPE key,
  FlashInfer's ragged causal prefill at head dims 192 / 128 -- SGLang's one-shot MHA forward for the same batch;
* flashmla BF16 absorbed: FlashInfer's MLA paged prefill over a BF16 cache (what SGLang runs for flashmla's
  extends whose prefixes sum to < 8 192 tokens and for every prefill in its captured prefill graphs).
The new tokens' own projections (q_b_proj, the absorbed route's W_UK / W_UV) are common work and left out. Each
call is timed between CUDA events (median of repeats, eager as in serving). Prints a table with the model's
prediction (`extend.route_costs`), the route it picks and the faster measured one, and the per-unit times fitted to
the measured cases (`fit_route_costs`, what `extend.ROUTE_COSTS` holds for the BF16 kv_b_proj); writes JSON and a PNG.

    python -m benchmarks.bench_extend_routes --kv-b-proj fp8 --out routes_fp8    # SGLANG_ENABLE_JIT_DEEPGEMM=0
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path
from types import SimpleNamespace

import torch

from harness.results import save_png
from sglang_snapmla import extend, ops
from sglang_snapmla import numerics as nx

CASES = [  # (requests, prefix, new tokens)
    (16, 4096, 32), (16, 4096, 128), (16, 4096, 512), (4, 16384, 128), (4, 16384, 1024), (1, 32768, 256),
    (1, 32768, 2048), (1, 57344, 8192), (64, 2048, 128), (8, 1024, 1024),
]
SCALE = 192 ** -0.5


def timed(fn, repeats: int = 10) -> float:
    """Median microseconds of fn() between CUDA events (after two warm-up calls)."""
    fn(), fn()
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return statistics.median(times)


class _Pool:
    def __init__(self, arrays):
        self.arrays = arrays
        self.num_slots = arrays[0].shape[0]

    def snapmla_buffers(self, layer_id):
        return self.arrays


def fp8_kv_b_proj(w_kv: torch.Tensor):
    """x [rows, 512] -> x @ w_kv through SGLang's W8A8 block-FP8 linear, w_kv [512, H x 256] stored as an FP8
    checkpoint's kv_b_proj is ([H x 256, 512] e4m3 in 128 x 128 blocks, `sglang_snapmla.block_fp8`), in calls of at
    most `extend.mha_chunk_capacity(H)` rows, the MHA chunks a snapmla server on FP8 weights runs (one larger call
    writes outside its output: `extend.bound_mha_chunk_capacity`)."""
    from sglang.srt.layers.quantization.fp8_utils import dispatch_w8a8_block_fp8_linear

    from sglang_snapmla.block_fp8 import BLOCK, quantize_block_fp8

    weight, scale_inv = quantize_block_fp8(w_kv.t().contiguous())
    linear = dispatch_w8a8_block_fp8_linear()  # as SGLang's Fp8LinearMethod picks it
    chunk = extend.mha_chunk_capacity(w_kv.shape[1] // 256)

    def upproj(x):
        parts = [linear(input=x[i:i + chunk], weight=weight, block_size=list(BLOCK), weight_scale=scale_inv)
                 for i in range(0, x.shape[0], chunk)]
        return parts[0] if len(parts) == 1 else torch.cat(parts)
    return upproj


def fit_route_costs(results: list[dict]) -> extend.RouteCosts:
    """The per-unit times that minimise the squared relative error of each route's modelled time against the
    measured cases (`extend.route_units`: each route's time is linear in them): how `extend.ROUTE_COSTS` was fitted."""
    import numpy as np

    coeffs = {}
    for route, key in ((0, "snapmla_absorbed_us"), (1, "snapmla_mha_us")):
        units = np.array([extend.route_units([r["prefix"]] * r["requests"], [r["new"]] * r["requests"],
                                             r["heads"])[route] for r in results])
        measured = np.array([r[key] * 1e-6 for r in results])
        coeffs[route], *_ = np.linalg.lstsq(units / measured[:, None], np.ones(len(results)), rcond=None)
    (a_fixed, a_pair), (m_fixed, m_upproj, m_pair) = coeffs[0], coeffs[1]
    return extend.RouteCosts(absorbed_pair=float(a_pair), absorbed_fixed=float(a_fixed), mha_upproj=float(m_upproj),
                             mha_pair=float(m_pair), mha_fixed=float(m_fixed))


def absorbed_extend(heads: int, requests: int, prefix: int, new: int, dev):
    """The backend's absorbed extend over `requests` requests of `prefix` cached + `new` tokens each, on random pages
    of a random pool, as a layer of a prefill step calls it (`SnapMLAForward._absorbed_extend`, its step plan made at
    the first call) -> (call() -> out [requests x new, heads x 512], inputs: .latent [slots, 576] bf16, .pool (the
    FP8 pool written from it), .req_to_token [requests, pages x 64] int32, .q [requests x new, heads, 512], .q_rope
    [.., 64], .scale)."""
    from sglang_snapmla.backend import SnapMLAForward

    total = prefix + new
    pages_per = math.ceil(total / nx.PAGE_SIZE)
    n_pages = requests * pages_per
    latent = torch.randn(n_pages * nx.PAGE_SIZE, 576, device=dev, dtype=torch.bfloat16)
    pool = ops.pool_from_rows(latent[:, :512], latent[:, 512:])
    pages = torch.randperm(n_pages, device=dev).view(requests, pages_per)
    req_to_token = (pages[:, :, None] * nx.PAGE_SIZE + torch.arange(nx.PAGE_SIZE, device=dev)).view(requests, -1)
    req_to_token = req_to_token.to(torch.int32)
    tokens = requests * new

    backend = SnapMLAForward()  # the attributes FlashMLABackend's __init__ sets, which the extend reads
    backend.token_to_kv_pool, backend.req_to_token, backend.max_pages = _Pool(pool), req_to_token, pages_per + 1
    backend.num_q_heads, backend.step_plan = heads, None
    layer = SimpleNamespace(layer_id=0, tp_q_head_num=heads, scaling=576 ** -0.5)
    fb = SimpleNamespace(extend_seq_lens_cpu=[new] * requests, seq_lens_cpu=torch.full((requests,), total),
                         req_pool_indices=torch.arange(requests, device=dev), out_cache_loc=None)
    q = torch.randn(tokens, heads, 512, device=dev, dtype=torch.bfloat16)
    qr = torch.randn(tokens, heads, 64, device=dev, dtype=torch.bfloat16)
    inputs = SimpleNamespace(latent=latent, pool=pool, req_to_token=req_to_token, q=q, q_rope=qr,
                             scale=layer.scaling)
    return (lambda: backend._absorbed_extend(q, None, layer, fb, False, qr, None)), inputs


def case(heads: int, requests: int, prefix: int, new: int, dev, kv_b_proj: str = "bf16") -> dict:
    res = {"heads": heads, "requests": requests, "prefix": prefix, "new": new, "kv_b_proj": kv_b_proj}
    call, inputs = absorbed_extend(heads, requests, prefix, new, dev)
    res["snapmla_absorbed_us"] = timed(call)
    total, tokens = prefix + new, requests * new
    latent, pool, req_to_token, q, qr = inputs.latent, inputs.pool, inputs.req_to_token, inputs.q, inputs.q_rope

    import flashinfer

    # MHA: every request's p + e rows, fetch-dequantized, up-projected, ragged causal prefill
    rows = req_to_token[:, :total].reshape(-1)
    w_kv = torch.randn(512, heads * 256, device=dev, dtype=torch.bfloat16) * 512 ** -0.5
    upproj = fp8_kv_b_proj(w_kv) if kv_b_proj == "fp8" else (lambda x: x @ w_kv)
    qm = torch.randn(tokens, heads, 192, device=dev, dtype=torch.bfloat16)
    workspace = torch.empty(512 << 20, dtype=torch.uint8, device=dev)
    ragged = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD")
    qo_indptr = torch.arange(requests + 1, device=dev, dtype=torch.int32) * new
    kv_indptr = torch.arange(requests + 1, device=dev, dtype=torch.int32) * total
    ragged.plan(qo_indptr, kv_indptr, heads, heads, 192, head_dim_vo=128, q_data_type=torch.bfloat16, causal=True)

    def mha():
        c, r = ops.fetch_dequant(rows, *pool)
        kv = upproj(c).view(-1, heads, 256)
        k = torch.empty(kv.shape[0], heads, 192, device=dev, dtype=torch.bfloat16)
        k[..., :128] = kv[..., :128]
        k[..., 128:] = r[:, None, :]
        return ragged.run(qm, k, kv[..., 128:])

    res["snapmla_mha_us"] = timed(mha)

    # flashmla BF16's absorbed route: FlashInfer's MLA paged prefill over the BF16 cache (page size 1, SGLang's)
    try:
        mla = flashinfer.mla.BatchMLAPagedAttentionWrapper(workspace, backend="auto")
        kv_len = torch.full((requests,), total, device=dev, dtype=torch.int32)
        mla.plan(qo_indptr, kv_indptr, rows, kv_len, heads, 512, 64, 1, True, 576 ** -0.5, torch.bfloat16,
                 torch.bfloat16)
        ckv, kpe = latent[:, :512].contiguous().view(-1, 1, 512), latent[:, 512:].contiguous().view(-1, 1, 64)
        res["flashmla_bf16_absorbed_us"] = timed(lambda: mla.run(q, qr, ckv, kpe))
    except Exception as e:  # recorded, never hidden
        res["flashmla_bf16_absorbed_error"] = repr(e)[:200]

    absorbed, mha_s = extend.route_costs([prefix] * requests, [new] * requests, heads)
    res.update(predicted_absorbed_us=absorbed * 1e6, predicted_mha_us=mha_s * 1e6,
               picks=("absorbed" if extend.prefers_absorbed([prefix] * requests, [new] * requests, heads) else "mha"),
               faster=("absorbed" if res["snapmla_absorbed_us"] < res["snapmla_mha_us"] else "mha"))
    return res


def table(results: list[dict]) -> str:
    lines = ["| heads | requests x prefix + new | snapmla absorbed us (model) | snapmla MHA us (model) | "
             "flashmla BF16 absorbed us | model picks | faster |", "|---:|---|---:|---:|---:|---|---|"]
    for r in results:
        lines.append(f"| {r['heads']} | {r['requests']} x {r['prefix']} + {r['new']} | "
                     f"{r['snapmla_absorbed_us']:.0f} ({r['predicted_absorbed_us']:.0f}) | "
                     f"{r['snapmla_mha_us']:.0f} ({r['predicted_mha_us']:.0f}) | "
                     f"{r.get('flashmla_bf16_absorbed_us', float('nan')):.0f} | {r['picks']} | {r['faster']} |")
    return "\n".join(lines)


def plot(results: list[dict], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 5))
    for route, marker in (("absorbed", "o"), ("mha", "s")):
        xs = [r[f"predicted_{route}_us"] for r in results]
        ys = [r[f"snapmla_{route}_us"] for r in results]
        ax.scatter(xs, ys, marker=marker, label=f"snapmla {route}")
    lo = min(min(r["predicted_absorbed_us"], r["predicted_mha_us"]) for r in results)
    hi = max(max(r["snapmla_absorbed_us"], r["snapmla_mha_us"]) for r in results)
    ax.plot([lo, hi], [lo, hi], "k:", label="measured = model")
    ax.set_xscale("log"), ax.set_yscale("log")
    ax.set_xlabel("cost model (us)"), ax.set_ylabel("measured (us)")
    ax.legend()
    fig.tight_layout()
    save_png(fig, path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--heads", nargs="+", type=int, default=[16, 128])
    ap.add_argument("--kv-b-proj", choices=("bf16", "fp8"), default="bf16",
                    help="the MHA route's up-projection: a BF16 GEMM, or an FP8 checkpoint's W8A8 block-FP8 linear")
    ap.add_argument("--out", type=Path, default=Path("routes_out"))
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    results = []
    for heads in args.heads:
        for requests, prefix, new in CASES:
            results.append(case(heads, requests, prefix, new, torch.device("cuda"), args.kv_b_proj))
            print(json.dumps(results[-1]), flush=True)
            torch.cuda.empty_cache()
    (args.out / "extend_routes.json").write_text(json.dumps(results, indent=1))
    print(table(results))
    print(f"fitted to these {len(results)} cases ({args.kv_b_proj} kv_b_proj): {fit_route_costs(results)}")
    print("plot:", plot(results, args.out / "extend_routes.png"))


if __name__ == "__main__":
    main()
