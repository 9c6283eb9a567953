"""benchmarks/bench_extend_routes.py: the per-unit fit that gives `extend.ROUTE_COSTS`, and the FP8 checkpoint's
kv_b_proj the MHA route is timed with under `--kv-b-proj fp8`."""

import json
from pathlib import Path

import pytest
import torch

from benchmarks import bench_extend_routes as bench
from sglang_snapmla import extend
from sglang_snapmla.block_fp8 import dequantize_block_fp8, quantize_block_fp8

ROOT = Path(__file__).resolve().parents[2]


def test_the_fit_of_the_saved_h100_run_is_route_costs():
    """Least squares on the relative error of each route over the saved run's 20 cases gives ROUTE_COSTS to the
    digits it keeps (3 for the per-pair and per-up-projection times, 2 for the per-batch ones)."""
    rows = json.loads((ROOT / "results/bench/extend_routes_h100.json").read_text())
    fitted, kept = bench.fit_route_costs(rows), extend.ROUTE_COSTS
    for field, digits in (("absorbed_pair", 3), ("mha_upproj", 3), ("mha_pair", 3), ("absorbed_fixed", 2),
                          ("mha_fixed", 2)):
        assert f"{getattr(fitted, field):.{digits - 1}e}" == f"{getattr(kept, field):.{digits - 1}e}", field


def test_the_fit_recovers_the_costs_that_made_the_times():
    """Times made by a known RouteCosts over cases of both head counts fit back to it."""
    true = extend.RouteCosts(absorbed_pair=2e-12, absorbed_fixed=1e-4, mha_upproj=5e-10, mha_pair=7e-13,
                             mha_fixed=2e-4)
    rows = []
    for heads in (16, 128):
        for requests, prefix, new in bench.CASES:
            absorbed, mha = extend.route_costs([prefix] * requests, [new] * requests, heads, true)
            rows.append({"heads": heads, "requests": requests, "prefix": prefix, "new": new,
                         "snapmla_absorbed_us": absorbed * 1e6, "snapmla_mha_us": mha * 1e6})
    fitted = bench.fit_route_costs(rows)
    for field in true.__dataclass_fields__:
        assert getattr(fitted, field) == pytest.approx(getattr(true, field), rel=1e-6), field


@pytest.mark.cpu_interpreter
def test_the_fp8_kv_b_proj_is_the_block_fp8_weight_times_sglangs_quantized_activations(monkeypatch):
    """`fp8_kv_b_proj(w)(x)` is x quantized per 128-group by SGLang, times w stored as block FP8 ([out, in], a scale
    per 128 x 128 block): with blocks of very different magnitudes a transposed or misplaced scale is far off."""
    import importlib

    from sglang.srt.layers.quantization import fp8_utils

    for name in ("sglang.kernels.ops.quantization.fp8_kernel", "sglang.kernels.ops.gemm.fp8_kernel"):  # 0.5.17, 0.5.23
        try:
            kernel = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(kernel, "get_w8a8_block_fp8_configs"):  # its tuned-config lookup names the GPU
            monkeypatch.setattr(kernel, "get_device_name", lambda *a: "CPU")
    g = torch.Generator().manual_seed(0)
    rows_scale = (10.0 ** torch.arange(-2, 2)).repeat_interleave(128)[:, None]  # the 4 input blocks
    cols_scale = torch.tensor([1.0, 30.0]).repeat_interleave(128)[None, :]  # the 2 output blocks
    w = (torch.randn(512, 256, generator=g) * rows_scale * cols_scale / 512 ** 0.5).bfloat16()
    x = torch.randn(4, 512, generator=g).bfloat16()
    out = bench.fp8_kv_b_proj(w)(x).float()
    q_x, s_x = fp8_utils.per_token_group_quant_fp8(x, 128, column_major_scales=False)
    x_used = (q_x.float().view(4, 4, 128) * s_x.view(4, 4, 1)).view(4, 512)
    q_w, s_w = quantize_block_fp8(w.t().contiguous())
    ref = x_used @ dequantize_block_fp8(q_w, s_w).t()
    assert out.shape == (4, 256) and float((out - ref).norm() / ref.norm()) < 1e-2
    # in MHA chunks of at most mha_chunk_capacity rows, as a server on FP8 weights up-projects: the same rows
    linear, calls = fp8_utils.dispatch_w8a8_block_fp8_linear(), []
    monkeypatch.setattr(fp8_utils, "dispatch_w8a8_block_fp8_linear",
                        lambda: lambda input, **kw: calls.append(input.shape[0]) or linear(input=input, **kw))
    monkeypatch.setattr(bench.extend, "mha_chunk_capacity", lambda heads: 3)
    assert torch.equal(bench.fp8_kv_b_proj(w)(x).float(), out) and calls == [3, 1]


@pytest.mark.cpu_interpreter
def test_the_timed_absorbed_extend_is_the_backends_and_attends_each_requests_pages():
    """The benchmark's snapmla absorbed call runs the backend as a prefill step calls it (its plan made from the
    batch) and, over 2 requests of a 2-page prefix + 16 new tokens on shuffled pages, gives causal attention over each
    request's own pages within FP8's error (the float64 golden on the unquantized latents)."""
    from sglang_snapmla import numerics as nx

    heads, requests, prefix, new = 16, 2, 128, 16
    call, inputs = bench.absorbed_extend(heads, requests, prefix, new, torch.device("cpu"))
    out = call().view(requests, new, heads, 512)
    latent, total = inputs.latent, prefix + new
    pages = inputs.req_to_token[:, ::nx.PAGE_SIZE].div(nx.PAGE_SIZE, rounding_mode="floor").int()
    golden, _ = nx.mla_decode_golden(inputs.q.view(requests, new, heads, 512),
                                     inputs.q_rope.view(requests, new, heads, 64), latent[:, :512], latent[:, 512:],
                                     pages, torch.full((requests,), total, dtype=torch.int32), inputs.scale)
    rel = ((out.double() - golden).norm() / golden.norm()).item()
    assert rel < 0.05, rel
