"""The sm_90a decode's plan in serving beside the benchmark's, computed on the CPU: for each (heads, batch, s_k) the
split count `decode_plan.plan_decode` picks for the block table's width (what `benchmarks.bench_kernels` times) and
for the static page bound a server plans every step with (`decode_plan.static_max_pages` of its --context-length, what
CUDA graphs need), and what each gives the kernel: CTAs, waves on the GPU's SMs, splits that get pages (the kernel
divides a sequence's own pages among the splits, `split_pages` in kernels/cuda/snapmla_decode_sm90.cu), pages per
CTA, fp32 partials. Where the two plans differ, `python -m benchmarks.bench_kernels --cuda --context-len N` times
the serving one.

    python -m tools.kernel_dev.serving_plans --heads 128 64 --batches 1 8 32 64 128 256 --s-k 640 1280 2048 \
        --context-len 163840 --sms 132 --out serving_plans.json
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

from sglang_snapmla import decode_plan
from sglang_snapmla.layout import KV_LORA_RANK, PAGE_SIZE


def pages_per_split(seq_len: int, splits: int) -> list[int]:
    """Pages each split of one sequence reads: ceil(pages / splits) per split in order, as the kernel's split_pages
    divides them; the later splits of a short sequence get none."""
    pages = math.ceil(seq_len / PAGE_SIZE)
    per = math.ceil(pages / splits)
    return [max(0, min(per, pages - s * per)) for s in range(splits)]


def plan_row(heads: int, batch: int, s_k: int, max_pages: int, sms: int, s_q: int = 1) -> dict:
    """What the sm_90a decode runs for `batch` sequences of `s_k` tokens planned over `max_pages` pages."""
    rows = s_q * heads
    splits = decode_plan.cuda_num_splits(batch, rows, max_pages, torch.device("cpu"), sms=sms)
    slots = decode_plan.partial_slots(batch, rows, splits, "cuda")
    ctas = batch * math.ceil(rows / decode_plan.CUDA_ROWS) * splits  # one CTA per 64-row tile (narrow: one)
    per_split = pages_per_split(s_k, splits)
    return {"splits": splits, "ctas": ctas, "waves": math.ceil(ctas / sms),
            "splits_with_pages": sum(p > 0 for p in per_split), "pages_per_cta": max(per_split),
            "partial_mb": round(batch * rows * slots * KV_LORA_RANK * 4 / 2**20, 1)}


def compare(heads: list[int], batches: list[int], s_ks: list[int], context_len: int, sms: int) -> list[dict]:
    """Per shape: the benchmark's plan (the sequences' own pages) and the serving plan (the context's bound)."""
    bound = decode_plan.static_max_pages(context_len)
    out = []
    for h in heads:
        for b in batches:
            for s_k in s_ks:
                if s_k > context_len:
                    raise SystemExit(f"s_k {s_k} exceeds --context-len {context_len}: a server would refuse it")
                out.append({"heads": h, "batch": b, "s_k": s_k,
                            "bench": plan_row(h, b, s_k, math.ceil(s_k / PAGE_SIZE), sms),
                            "serving": plan_row(h, b, s_k, bound, sms)})
    return out


def table(rows: list[dict], context_len: int) -> str:
    head = ("| heads | batch | s_k | splits: bench / serving | CTAs | waves | splits with pages | pages per CTA | "
            "partials MiB | same plan |")
    lines = [f"serving plan: --context-length {context_len} ({decode_plan.static_max_pages(context_len)} pages)",
             head, "|" + "---:|" * 9 + "---|"]
    for r in rows:
        b, s = r["bench"], r["serving"]

        def pair(key):
            return f"{b[key]} / {s[key]}" if b[key] != s[key] else f"{b[key]}"

        lines.append(f"| {r['heads']} | {r['batch']} | {r['s_k']} | {b['splits']} / {s['splits']} | {pair('ctas')} | "
                     f"{pair('waves')} | {pair('splits_with_pages')} | {pair('pages_per_cta')} | "
                     f"{pair('partial_mb')} | {'yes' if b['splits'] == s['splits'] else 'no'} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--heads", type=int, nargs="+", default=[128, 64])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 16, 32, 64, 128, 256])
    ap.add_argument("--s-k", type=int, nargs="+", default=[640, 1280, 2048])
    ap.add_argument("--context-len", type=int, default=163840, help="the server's --context-length (V3/R1: 163840)")
    ap.add_argument("--sms", type=int, default=132, help="SMs of the GPU planned for (H100 and H200: 132)")
    ap.add_argument("--out", type=Path, default=None, help="also write the rows as JSON here")
    args = ap.parse_args()
    rows = compare(args.heads, args.batches, args.s_k, args.context_len, args.sms)
    print(table(rows, args.context_len))
    if args.out:
        args.out.write_text(json.dumps({"context_len": args.context_len, "sms": args.sms, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
