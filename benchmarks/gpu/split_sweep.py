"""Small-batch decode: where the time goes and which split count is fastest (GPU host, after
`source tools/gpu_host/env.sh`):

    python3 -m benchmarks.gpu.split_sweep [--shapes 1x640,1x4096,8x640] [--heads 128 16] [--impl cuda]
        [--splits 1,2,4,8] [--full-by-splits] [--parts] [--slots 16,32]

Per shape (BxS_K, s_q 1): FlashMLA BF16 (decode + its combine), our Q quantization alone, our decode + combine on
pre-quantized Q for each split count, and the full `quantize_and_decode` (Q-quant + decode + combine) with the default
split count (with --full-by-splits, the full call at every split count too; with --parts, the CUDA decode kernel and
the combine each alone, at every split count; with --slots, the same with the partial rows that many slots apart,
o_part [B, H, slots, 512], beside the unpadded slots = splits). Same timing as benchmarks/bench_kernels.py (CUDA
graph of 20 calls, median of 15 replays). Prints a table, writes $OUT/split_sweep.json."""

import argparse
import json
import math
import os

import torch

from harness.kernel_timing import PAGE, make_inputs, time_graph

from sglang_snapmla import decode_plan, ops


DEFAULT_SPLITS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 32, 64)


def time_parts(q8, qs, qra, x, seqlens, scale, splits, slots=None) -> tuple[float, float]:
    """(CUDA decode kernel alone, combine alone) in µs at `splits` splits (> 1), s_q 1, without PDL, the partials
    `slots` (default `splits`) slots per row."""
    from sglang_snapmla import numerics as nx

    B, _, H, _ = q8.shape
    slots = slots or splits
    o_part = torch.empty(B, H, slots, nx.KV_LORA_RANK, dtype=torch.float32, device=q8.device)
    lse_part = torch.empty(B, H, slots, dtype=torch.float32, device=q8.device)
    out = torch.empty(B, 1, H, nx.KV_LORA_RANK, dtype=torch.bfloat16, device=q8.device)
    lse = torch.empty(B, H, 1, dtype=torch.float32, device=q8.device)

    def dec():
        ops.launch_cuda_decode(q8, qs, qra, x["kv8"], x["ks"], x["kr"], x["bt"], seqlens, o_part, lse_part, out[:0],
                               lse[:0], scale, splits)

    def comb():
        ops.combine(o_part, lse_part, out, lse, H, 1, splits=splits)

    dec()
    return time_graph(lambda _: dec, 1), time_graph(lambda _: comb, 1)


def sweep(b: int, sk: int, h: int, impl: str, split_counts=DEFAULT_SPLITS, full_by_splits: bool = False,
          parts: bool = False, slot_counts=()) -> dict:
    x = make_inputs(b, sk, h, 1, 1, "cuda")[0]
    seqlens = torch.full((b,), sk, device="cuda", dtype=torch.int32)
    scale = 576 ** -0.5
    qn, qr = x["q"][..., :512], x["q"][..., 512:]
    q8, qs, qra = ops.quantize_q(qn.reshape(b, h, -1), qr.reshape(b, h, -1))
    q8, qs, qra = q8.view(b, 1, h, -1), qs.view(b, 1, h), qra.view(b, 1, h, -1)
    pages = math.ceil(sk / PAGE)
    res = {"default_splits": decode_plan.plan_decode(b, 1, h, pages, q8.device, impl).splits}

    from sgl_kernel.flash_mla import flash_mla_with_kvcache, get_mla_metadata

    md, ns = get_mla_metadata(seqlens, h, 1)
    kv = x["ckv"].view(-1, PAGE, 1, 576)
    res["flashmla_bf16"] = time_graph(lambda _: lambda: flash_mla_with_kvcache(
        x["q"], kv, x["bt"], seqlens, 512, md, ns, softmax_scale=scale, causal=True), 1)
    res["q_quant"] = time_graph(lambda _: lambda: ops.quantize_q(qn.reshape(b, h, -1), qr.reshape(b, h, -1)), 1)
    res["full_default"] = time_graph(lambda _: lambda: ops.quantize_and_decode(
        qn, qr, x["kv8"], x["ks"], x["kr"], x["bt"], seqlens, scale, impl=impl), 1)
    res["decode_by_splits"], res["full_by_splits"], res["parts_by_splits"] = {}, {}, {}
    for splits in sorted(set(split_counts) & set(range(1, pages + 1))):
        res["decode_by_splits"][splits] = time_graph(lambda _, s=splits: lambda: ops.decode_quantized(
            q8, qs, qra, x["kv8"], x["ks"], x["kr"], x["bt"], seqlens, scale, num_splits=s, impl=impl), 1)
        if full_by_splits:
            res["full_by_splits"][splits] = time_graph(lambda _, s=splits: lambda: ops.quantize_and_decode(
                qn, qr, x["kv8"], x["ks"], x["kr"], x["bt"], seqlens, scale, num_splits=s, impl=impl), 1)
        if parts and splits > 1:
            res["parts_by_splits"][splits] = time_parts(q8, qs, qra, x, seqlens, scale, splits)
            for slots in slot_counts:
                if slots > splits:
                    res.setdefault("parts_by_slots", {}).setdefault(splits, {})[slots] = time_parts(
                        q8, qs, qra, x, seqlens, scale, splits, slots)
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="1x640,1x4096,8x640")
    ap.add_argument("--heads", type=int, nargs="+", default=[128, 16])
    ap.add_argument("--impl", default="cuda")
    ap.add_argument("--splits", default=",".join(map(str, DEFAULT_SPLITS)), help="split counts to time")
    ap.add_argument("--full-by-splits", action="store_true", help="also time the full call at every split count")
    ap.add_argument("--parts", action="store_true", help="also time the decode kernel and the combine alone")
    ap.add_argument("--slots", default="", help="with --parts: also with the partial rows this many slots apart")
    a = ap.parse_args()
    counts = [int(v) for v in a.splits.split(",")]
    out = {}
    print("| h | b | s_k | FlashMLA BF16 | Q-quant | full (default splits) | decode+combine by splits (µs) | best |")
    print("|---|---|---|---:|---:|---:|---|---|")
    for h in a.heads:
        for shape in a.shapes.split(","):
            b, sk = (int(v) for v in shape.split("x"))
            r = sweep(b, sk, h, a.impl, counts, a.full_by_splits, a.parts,
                      [int(v) for v in a.slots.split(",") if v])
            out[f"h{h}_b{b}_sk{sk}"] = r
            by = r["decode_by_splits"]
            best = min(by, key=by.get)
            cells = ", ".join(f"{s}: {t:.1f}" + ("*" if s == r["default_splits"] else "") for s, t in by.items())
            print(f"| {h} | {b} | {sk} | {r['flashmla_bf16']:.1f} | {r['q_quant']:.1f} | {r['full_default']:.1f} | "
                  f"{cells} | {best} ({by[best]:.1f}) |", flush=True)
            if r["full_by_splits"]:
                fb = r["full_by_splits"]
                fbest = min(fb, key=fb.get)
                print("|   | full call by splits | | | | | " + ", ".join(f"{s}: {t:.1f}" for s, t in fb.items())
                      + f" | {fbest} ({fb[fbest]:.1f}) |", flush=True)
            if r["parts_by_splits"]:
                print("|   | decode kernel / combine alone | | | | | " + ", ".join(
                    f"{s}: {d:.1f} / {c:.1f}" for s, (d, c) in r["parts_by_splits"].items()) + " | |", flush=True)
            for splits, by_slots in r.get("parts_by_slots", {}).items():
                print(f"|   | {splits} splits, decode / combine by slots | | | | | " + ", ".join(
                    f"{n}: {d:.1f} / {c:.1f}" for n, (d, c) in {splits: r["parts_by_splits"][splits],
                                                                 **by_slots}.items()) + " | |", flush=True)
    path = os.path.join(os.environ.get("OUT", "."), "split_sweep.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    print("wrote", path, "(* = default split count)")


if __name__ == "__main__":
    main()
