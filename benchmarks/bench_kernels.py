"""Kernel benchmark: SnapMLA decode (Q-quant + split-KV decode + combine) vs FlashMLA and FlashInfer, one run.

    python -m benchmarks.bench_kernels --out bench_out          # on the H100 host, runtime active

Every kernel is timed the same way: G calls, each on its own copy of the inputs (copies rotate so the working set
exceeds L2), captured into one CUDA graph (serving replays decode in graphs, so launch overhead is excluded for
all); the graph is replayed R times between CUDA events and the median per-call time is reported.
Prints a table (us, TFLOPS, GB/s, ratio vs FlashMLA BF16) and writes JSON and a PNG.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import sys
from pathlib import Path

import torch

from harness.kernel_timing import L2_ROTATE_BYTES, PAGE, make_inputs, time_graph
from harness.results import read_json, save_png
from sglang_snapmla import decode_plan, layout
from sglang_snapmla import numerics as nx
from sglang_snapmla import ops

# (batch, s_k): batch 1; the serving batches of chat and agent traffic at short contexts (64-256 requests at 640-2 048
# tokens, where DeepSeek-V3 under DP attention decodes 128 heads a GPU); mid and long contexts
SHAPES = [(1, 640), (64, 640), (128, 640), (256, 1280), (128, 2048), (32, 8192), (128, 4096), (128, 16384),
          (64, 65536)]


def bench_shape(b, sk, h, s_q, dev, check: bool, flashinfer: bool, cuda: bool = False, per_token: bool = False,
                context_len: int | None = None, q_in_decode: bool = False):
    """One shape, every kernel timed. snapmla's split count is planned for the block table's width (the sequences'
    own pages) or, with `context_len`, for the static page bound a server with that context length plans every step
    with (`decode_plan.static_max_pages`, what CUDA graphs need). `q_in_decode`: also the sm_90a chain with the 64-row
    kernel quantizing Q itself (SNAPMLA_Q_IN_DECODE=1), where that kernel runs."""
    pages = math.ceil(sk / PAGE)
    bf16_bytes = b * sk * 1152
    copies = max(1, min(8, math.ceil(L2_ROTATE_BYTES / bf16_bytes)))
    inp = make_inputs(b, sk, h, s_q, copies, dev)
    seqlens = torch.full((b,), sk, device=dev, dtype=torch.int32)
    scale = 1 / math.sqrt(576)
    flops = 2 * b * h * s_q * sk * (576 + 512)
    rows = {}

    bound = decode_plan.static_max_pages(context_len) if context_len else inp[0]["bt"].shape[1]
    # the implementations timed only: planning for "cuda" resolves (and may build) the sm_90a extension
    impls = ("triton", "cuda") if cuda else ("triton",)
    splits = {impl: decode_plan.plan_decode(b, s_q, h, bound, dev, impl).splits for impl in impls}

    def ours(i, impl="triton", q_in_decode=None):
        x = inp[i]
        qn, qr = x["q"][..., :512], x["q"][..., 512:]
        return lambda: ops.quantize_and_decode(qn, qr, x["kv8"], x["ks"], x["kr"], x["bt"], seqlens, scale,
                                               num_splits=splits[impl], impl=impl, q_in_decode=q_in_decode)

    rows["snapmla_triton"] = (time_graph(ours, copies), b * sk * layout.BYTES_PER_TOKEN)
    if cuda:  # the sm_90a kernel (SNAPMLA_DECODE_IMPL=cuda), same inputs, same combine
        rows["snapmla_cuda_sm90"] = (time_graph(lambda i: ours(i, "cuda"), copies), b * sk * layout.BYTES_PER_TOKEN)
        if q_in_decode and s_q * h > decode_plan.CUDA_NARROW_MAX_ROWS:
            rows[Q_IN_DECODE_ROW] = (time_graph(lambda i: ours(i, "cuda", True), copies),
                                     b * sk * layout.BYTES_PER_TOKEN)

    from sgl_kernel.flash_mla import flash_mla_with_kvcache, get_mla_metadata

    md, ns = get_mla_metadata(seqlens, s_q * h, 1)

    def flashmla_bf16(i):
        x = inp[i]
        kv = x["ckv"].view(-1, PAGE, 1, 576)
        return lambda: flash_mla_with_kvcache(x["q"], kv, x["bt"], seqlens, 512, md, ns, softmax_scale=scale,
                                              causal=True)

    rows["flashmla_bf16"] = (time_graph(flashmla_bf16, copies), bf16_bytes)

    try:
        md8, ns8 = get_mla_metadata(seqlens, s_q * h, 1, is_fp8_kvcache=True)
        one = torch.ones(1, device=dev, dtype=torch.float32)
        fp8_copies = [(x["q"].to(torch.float8_e4m3fn), x["ckv"].to(torch.float8_e4m3fn).view(-1, PAGE, 1, 576))
                      for x in inp]

        def flashmla_fp8(i):
            q8, kv8 = fp8_copies[i]
            return lambda: flash_mla_with_kvcache(q8, kv8, inp[i]["bt"], seqlens, 512, md8, ns8, softmax_scale=scale,
                                                  causal=True, descale_q=one, descale_k=one)

        rows["flashmla_fp8_pertensor"] = (time_graph(flashmla_fp8, copies), b * sk * 576)
    except Exception as e:  # reported, not hidden
        print(f"  flashmla fp8 failed: {e!r:.200}", file=sys.stderr)

    flashinfer_calls = {}
    for label, (kv_dtype, bytes_per_token) in FLASHINFER_CACHES.items():
        if not flashinfer or (label == PER_TOKEN and not per_token):
            continue
        try:
            us, flashinfer_calls[label] = bench_flashinfer(inp, b, sk, h, s_q, seqlens, scale, kv_dtype, copies,
                                                           per_token=label == PER_TOKEN)
            rows[label] = (us, b * sk * bytes_per_token)
        except Exception as e:
            print(f"  {label} failed: {e!r:.300}", file=sys.stderr)

    errs = {}
    if check:  # outputs vs FlashMLA BF16 on copy 0
        ref = flashmla_bf16(0)()[0].float()
        for name, impl in (("snapmla_triton", "triton"), ("snapmla_cuda_sm90", "cuda")):
            if name in rows:
                o, _ = ours(0, impl)()
                errs[name] = ((o.float() - ref).norm() / ref.norm()).item()
        for name, call in flashinfer_calls.items():  # FlashInfer's out is [b * s_q, h, 512]
            try:
                o = call(0)().float().view(ref.shape)
                errs[name] = ((o - ref).norm() / ref.norm()).item()
            except Exception as e:  # reported, not hidden; its timing stays
                print(f"  {name} error check failed: {e!r:.300}", file=sys.stderr)
    del inp
    torch.cuda.empty_cache()
    res = []
    base = rows["flashmla_bf16"][0]
    planned = {"snapmla_triton": splits["triton"], "snapmla_cuda_sm90": splits.get("cuda"),
               Q_IN_DECODE_ROW: splits.get("cuda")}
    for name, (us, byts) in rows.items():
        res.append(dict(kernel=name, h=h, s_q=s_q, b=b, sk=sk, us=us, tflops=flops / us / 1e6, gbps=byts / us / 1e3,
                        speedup_vs_flashmla_bf16=base / us,
                        rel_err_vs_flashmla_bf16=errs.get(name), splits=planned.get(name),
                        context_len=context_len if name in planned else None))
    return res


# the sm_90a chain with the 64-row kernel quantizing Q itself (--q-in-decode; SNAPMLA_Q_IN_DECODE=1)
Q_IN_DECODE_ROW = "snapmla_cuda_sm90_q_in_decode"
# FlashInfer's MLA caches timed here: label -> (cache dtype, bytes per token and layer). The per-token one is
# FlashInfer 0.7's `ckv_scale_arr` (its PR #4373): c_KV in FP8 with one fp32 scale per token and 128 channels, the
# RoPE key in FP8 at one per-tensor scale (`kpe_scale`); 512 + 64 + 4 x 4 bytes.
PER_TOKEN = "flashinfer_fa3_fp8_per_token"
FLASHINFER_CACHES = {"flashinfer_fa3_bf16": (torch.bfloat16, 1152), "flashinfer_fa3_fp8": (torch.float8_e4m3fn, 576),
                     PER_TOKEN: (torch.float8_e4m3fn, 592)}
FLASHINFER_SCALE_BLOCK = 128


def flashinfer_fp8_per_token(ckv: torch.Tensor, kpe: torch.Tensor):
    """ckv [N, 512] and kpe [N, 64] bf16 rows -> FlashInfer 0.7's per-token FP8 MLA cache: ckv8 [N, 512] fp8 with
    scales [N, 512 / 128] fp32 (amax / 448 of each token's 128-channel block, floored as snapmla's), kpe8 [N, 64] fp8
    and kpe_scale (float, amax / 448 of the whole RoPE key array). FlashInfer's kernel multiplies each block back by
    its scale (`mla_hopper.cuh`)."""
    n, d = ckv.shape
    blocks = ckv.float().view(n, d // FLASHINFER_SCALE_BLOCK, FLASHINFER_SCALE_BLOCK)
    scales = nx.amax_scale(blocks.abs().amax(-1))
    ckv8 = nx.to_fp8(blocks / scales[..., None]).view(n, d)
    kpe_scale = nx.amax_scale(kpe.float().abs().amax()).item()
    return ckv8, scales.contiguous(), nx.to_fp8(kpe.float() / kpe_scale), kpe_scale


def bench_flashinfer(inp, b, sk, h, s_q, seqlens, scale, kv_dtype, copies, per_token: bool = False):
    """FlashInfer's batched MLA decode (backend fa3) on the same rows -> (median µs, call): call(i)() runs copy i and
    returns out [b * s_q, h, 512]. `per_token`: FP8 with FlashInfer 0.7's per-token scales (flashinfer_fp8_per_token),
    else the cache cast to kv_dtype (FP8 at scale 1)."""
    import flashinfer.mla  # the submodule itself: build-flashinfer-mla.sh's package __init__ imports nothing

    dev = seqlens.device
    pages = math.ceil(sk / PAGE)
    ws = torch.empty(128 << 20, dtype=torch.int8, device=dev)
    w = flashinfer.mla.BatchMLAPagedAttentionWrapper(ws, backend="fa3")
    if per_token and "ckv_scale_arr" not in inspect.signature(w.run).parameters:
        raise RuntimeError(f"FlashInfer {flashinfer.__version__} has no per-token MLA scales (ckv_scale_arr, 0.7+): "
                           "run with tools/gpu_host/flashinfer_mla.sh")
    qo_indptr = torch.arange(b + 1, device=dev, dtype=torch.int32) * s_q
    kv_indptr = torch.arange(b + 1, device=dev, dtype=torch.int32) * pages
    kv_lens = seqlens
    datas = []
    for x in inp:
        kv_idx = x["bt"].reshape(-1).contiguous()
        ckv, kpe = x["ckv"][:, :512], x["ckv"][:, 512:]
        if per_token:
            ckv8, scales, kpe8, kpe_scale = flashinfer_fp8_per_token(ckv, kpe)
            caches = (ckv8.view(-1, PAGE, 512), kpe8.view(-1, PAGE, 64))
            extra = dict(ckv_scale_arr=scales.view(-1, PAGE, scales.shape[-1]), kpe_scale=kpe_scale)
        else:
            caches = (ckv.contiguous().view(-1, PAGE, 512).to(kv_dtype), kpe.contiguous().view(-1, PAGE, 64).to(kv_dtype))
            extra = {} if kv_dtype == torch.bfloat16 else dict(ckv_scale=1.0, kpe_scale=1.0)
        qn = x["q"][..., :512].reshape(b * s_q, h, 512).contiguous()
        qp = x["q"][..., 512:].reshape(b * s_q, h, 64).contiguous()
        datas.append((kv_idx, *caches, qn, qp, extra))
    w.plan(qo_indptr, kv_indptr, datas[0][0], kv_lens, h, 512, 64, PAGE, True, scale, torch.bfloat16, kv_dtype)

    def call(i):
        _, ckv, kpe, qn, qp, extra = datas[i]
        return lambda: w.run(qn, qp, ckv, kpe, **extra)

    # the plan binds one page list; all copies share the same page-table shape so one plan serves (indices of copy 0)
    return time_graph(call, copies), call


DRAM_BYTES = 1 << 30  # far beyond the 50-60 MB L2: every byte goes to and from DRAM


def dram_rates(dev, nbytes: int = DRAM_BYTES) -> dict:
    """What the GPU's DRAM delivers to simple kernels, in TB/s, timed like the decode (CUDA graph, median of
    replays): `read_tb_s`, a sum over `nbytes` (reads only, as a decode's cache traffic nearly is), and
    `read_write_tb_s`, an elementwise add writing `nbytes` beside reading them (bytes read plus bytes written).
    A device-to-device `copy_` (cudaMemcpy) of the same bytes moves less (2.75 TB/s read plus write on an H200): it
    is not the ceiling a kernel's reads are held to."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=dev).normal_()
    dst = torch.empty_like(src)
    total = torch.empty((), dtype=torch.float32, device=dev)
    read_us = time_graph(lambda _: lambda: torch.sum(src, dim=0, out=total), 1, calls_per_graph=4)
    rw_us = time_graph(lambda _: lambda: torch.add(src, 1, out=dst), 1, calls_per_graph=4)
    return {"read_tb_s": nbytes / read_us / 1e6, "read_write_tb_s": 2 * nbytes / rw_us / 1e6}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("bench_out"))
    ap.add_argument("--heads", type=int, nargs="+", default=[128, 64, 16])
    ap.add_argument("--sq", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--no-flashinfer", action="store_true", help="skip FlashInfer (its JIT build takes minutes)")
    ap.add_argument("--flashinfer-per-token", action="store_true",
                    help="also FlashInfer 0.7's FP8 cache with per-token scales (tools/gpu_host/flashinfer_mla.sh)")
    ap.add_argument("--cuda", action="store_true", help="also time the sm_90a CUDA decode (SNAPMLA_DECODE_IMPL=cuda)")
    ap.add_argument("--q-in-decode", action="store_true",
                    help=f"with --cuda, also time the chain with the 64-row kernel quantizing Q itself "
                         f"({Q_IN_DECODE_ROW}: SNAPMLA_Q_IN_DECODE=1; more than 32 query rows)")
    ap.add_argument("--shapes", nargs="+", default=[f"{b}x{sk}" for b, sk in SHAPES], help="BxS_K list")
    ap.add_argument("--redraw", type=Path, metavar="JSON",
                    help="print the table of a saved run (its bench_kernels JSON, plain or .xz) and draw its plot "
                         "beside it (NAME.png); no GPU needed")
    ap.add_argument("--context-len", type=int, default=None,
                    help="plan snapmla's splits as a server with this --context-length does (its static page bound, "
                         "e.g. 163840 for DeepSeek-V3) instead of for the table's width")
    args = ap.parse_args()
    if args.redraw:
        results = read_json(args.redraw)["results"]
        print_table(results)
        plot(results, args.redraw.parent / (args.redraw.name.split(".")[0] + ".png"))
        return
    dev = torch.device("cuda")
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for h in args.heads:
        for s_q in args.sq:
            for b, sk in (tuple(int(v) for v in s.split("x")) for s in args.shapes):
                rs = bench_shape(b, sk, h, s_q, dev, check=True, flashinfer=not args.no_flashinfer, cuda=args.cuda,
                                 per_token=args.flashinfer_per_token, context_len=args.context_len,
                                 q_in_decode=args.q_in_decode)
                results.extend(rs)
                for r in rs:
                    print(json.dumps(r), flush=True)
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, **dram_rates(dev))
    print(f"DRAM, {DRAM_BYTES >> 20} MiB: {meta['read_tb_s']:.2f} TB/s read (a sum), {meta['read_write_tb_s']:.2f} "
          "TB/s read + written (an elementwise add)")
    (args.out / "bench_kernels.json").write_text(json.dumps(dict(meta=meta, results=results), indent=1))
    print_table(results)
    plot(results, args.out / "bench_kernels.png")


def print_table(results):
    kernels = ["snapmla_triton", "snapmla_cuda_sm90", Q_IN_DECODE_ROW, "flashmla_bf16", "flashmla_fp8_pertensor",
               *FLASHINFER_CACHES]
    print("\nours = snapmla_cuda_sm90 where it was timed (--cuda), else snapmla_triton")
    print("| h | s_q | b | s_k | " + " | ".join(f"{k} us" for k in kernels) +
          " | ours TFLOPS | ours GB/s | ours / FlashMLA BF16 | ours / FlashMLA FP8 | rel err vs BF16 |"
          " FlashInfer per-token rel err |")
    print("|" + "---|" * (4 + len(kernels) + 6))
    keyed = {}
    for r in results:
        keyed.setdefault((r["h"], r["s_q"], r["b"], r["sk"]), {})[r["kernel"]] = r
    for (h, s_q, b, sk), d in keyed.items():
        us = [f"{d[k]['us']:.1f}" if k in d else "-" for k in kernels]
        o = d.get("snapmla_cuda_sm90", d["snapmla_triton"])  # "ours": the fastest path measured
        fp8 = d.get("flashmla_fp8_pertensor")
        per_token_err = (d.get(PER_TOKEN) or {}).get("rel_err_vs_flashmla_bf16")
        print(f"| {h} | {s_q} | {b} | {sk} | " + " | ".join(us) +
              f" | {o['tflops']:.0f} | {o['gbps']:.0f} | {o['speedup_vs_flashmla_bf16']:.2f}x | "
              f"{(fp8['us'] / o['us']) if fp8 else float('nan'):.2f}x | {o['rel_err_vs_flashmla_bf16']:.4f} | "
              + (f"{per_token_err:.4f} |" if per_token_err is not None else "- |"))


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keyed = {}
    for r in results:
        keyed.setdefault((r["h"], r["s_q"], r["b"], r["sk"]), {})[r["kernel"]] = r["speedup_vs_flashmla_bf16"]
    labels = [f"h{h} q{s} b{b} {sk // 1024 if sk >= 1024 else sk}{'k' if sk >= 1024 else ''}"
              for (h, s, b, sk) in keyed]
    kernels = sorted({k for d in keyed.values() for k in d})
    fig, ax = plt.subplots(figsize=(max(10, len(labels) * 0.55), 4.5))
    width = 0.8 / len(kernels)
    for i, k in enumerate(kernels):
        ax.bar([j + i * width for j in range(len(labels))], [d.get(k, 0) for d in keyed.values()], width, label=k)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks([j + 0.4 for j in range(len(labels))])
    ax.set_xticklabels(labels, rotation=70, fontsize=7)
    ax.set_ylabel("speedup vs FlashMLA BF16")
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_png(fig, path, dpi=110)


if __name__ == "__main__":
    main()
