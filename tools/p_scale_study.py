"""How much accuracy each rule for P's per-block FP8 scale costs, against the float64 golden (CPU, reference only).

    python -m tools.p_scale_study [--out p_scale_study.json]

SnapMLA quantizes P' = P * sigma_k to FP8 per (row, 64-token block) with scale amax(P') / 448. A bound the kernel
already has (max_j P_j x max_j sigma_kj, "SnapMLA-boundP") would save ~60 of the softmax warpgroup's ~430
instructions per page; "SnapMLA-pow2P" rounds the scale up to a power of two. FP8's
relative precision does not depend on the scale for normal values, but only the amax maps the block's largest
weight exactly onto 448: the problems test whether that matters (per-token content magnitudes spread over four
decades, i.e. sigma_k far from its block maximum; peaked attention, where one weight dominates; RoPE outliers).
Prints a table (rel-L2 of each config vs the golden, per problem) and writes JSON (rel-L2 and 1 - cos).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

from harness.problems import golden_args, paged_problem

from study.ablations import decode_with_config
from sglang_snapmla.numerics import error_metrics, mla_decode_golden

CONFIGS = ("SnapMLA", "SnapMLA-boundP", "SnapMLA-pow2P", "BF16")


def problem(kind: str, seed: int, seq_len: int = 1000, heads: int = 16) -> dict:
    """One decode problem of batch 2; `kind` says what is hard about it."""
    gen = torch.Generator().manual_seed(seed)
    p = paged_problem(gen, [seq_len, seq_len // 3 + 7], heads, rope_outlier=1e3 if kind == "rope_outliers" else None,
                      zero_rows=5 if kind == "spread_scales" else 0)
    if kind in ("spread_scales", "spread_peaked"):  # token magnitudes log-uniform over 1e-2 .. 1e2
        p["c_kv"] *= torch.pow(10.0, 4 * torch.rand(p["c_kv"].shape[0], 1, generator=gen) - 2)
    if kind in ("peaked", "spread_peaked"):  # each query close to one key of its sequence: a sharp softmax
        for b, n in enumerate(p["seq_lens"].tolist()):
            pages = p["block_table"][b].long()
            slot = pages[torch.randint(0, math.ceil(n / 64), (1,), generator=gen)] * 64
            p["q_nope"][b] += 8 * p["c_kv"][slot] / p["c_kv"][slot].norm() * math.sqrt(512)
    return p


def study(kinds=("unit", "spread_scales", "peaked", "spread_peaked", "rope_outliers"), seeds=(0, 1)) -> dict:
    """{kind: {config: {rel_l2, one_minus_cos}}} averaged over `seeds` (rel-L2 of the whole output)."""
    res: dict = {}
    for kind in kinds:
        acc = {c: {"rel_l2": 0.0, "one_minus_cos": 0.0} for c in CONFIGS}
        for seed in seeds:
            p = problem(kind, seed)
            golden = mla_decode_golden(*golden_args(p))[0]
            for c in CONFIGS:
                m = error_metrics(decode_with_config(c, *golden_args(p))[0], golden)
                for k in acc[c]:
                    acc[c][k] += m[k] / len(seeds)
        res[kind] = acc
    return res


def table(res: dict) -> str:
    lines = ["| problem | " + " | ".join(f"{c} rel-L2" for c in CONFIGS) + " | boundP / SnapMLA |",
             "|---|" + "---:|" * (len(CONFIGS) + 1)]
    for kind, acc in res.items():
        ratio = acc["SnapMLA-boundP"]["rel_l2"] / acc["SnapMLA"]["rel_l2"]
        lines.append(f"| {kind} | " + " | ".join(f"{acc[c]['rel_l2']:.3e}" for c in CONFIGS) + f" | {ratio:.3f} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("p_scale_study.json"))
    args = ap.parse_args(argv)
    res = study()
    print(table(res))
    args.out.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
