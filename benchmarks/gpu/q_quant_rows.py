"""The fused Q-quant at each block size (heads of one token per program), against a copy of the same bytes (GPU host,
after `source tools/gpu_host/env.sh`):

    python3 -m benchmarks.gpu.q_quant_rows [--shapes 1x128 32x128 64x128 128x128 256x128 128x64 128x16 1024x16]
        [--rows 1 2 4 8 16] [--out DIR]

Per TxH shape: µs per call of `ops.quantize_q(rows=R)` for each R, the plan's choice (`decode_plan.q_quant_rows`,
marked *), and the time a device-to-device copy of the bytes the Q-quant moves takes (reads 1 152 B, writes 644 B per
row: the floor a memory-bound Q-quant can reach). Same timing as benchmarks/bench_kernels.py (CUDA graph of 20 calls,
median of 15 replays). Prints a table, writes DIR/q_quant_rows.json and DIR/q_quant_rows.png."""

import argparse
import json
from pathlib import Path

import torch

from harness.kernel_timing import time_graph
from harness.results import save_png

from sglang_snapmla import decode_plan, ops

READ_BYTES, WRITE_BYTES = 1152, 512 + 4 + 128  # one row: bf16 q_nope + q_rope in; fp8 content, fp32 scale, rope' out


def time_shape(tokens: int, heads: int, rows_list) -> dict:
    q = torch.randn(tokens, heads, 576, device="cuda").to(torch.bfloat16)
    qn, qr = q[..., :512], q[..., 512:]  # strided views, as the backend passes them
    moved = tokens * heads * (READ_BYTES + WRITE_BYTES)
    src = torch.empty(moved // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    res = {"tokens": tokens, "heads": heads, "plan_rows": decode_plan.q_quant_rows(tokens, heads), "bytes": moved,
           "copy_us": time_graph(lambda _: lambda: dst.copy_(src), 1), "us_by_rows": {}}
    for rows in rows_list:
        if rows <= max(heads, 1) * 2:  # a block larger than twice the heads only masks more lanes
            res["us_by_rows"][rows] = time_graph(lambda _, r=rows: lambda: ops.quantize_q(qn, qr, rows=r), 1)
    return res


def print_table(results, rows_list):
    print("| tokens | heads | MB moved | copy µs | " + " | ".join(f"{r} rows µs" for r in rows_list)
          + " | plan | plan GB/s | plan / 1 row |")
    print("|" + "---:|" * (4 + len(rows_list) + 3))
    for r in results:
        by = r["us_by_rows"]
        cells = [(f"{by[n]:.1f}" + ("*" if n == r["plan_rows"] else "")) if n in by else "-" for n in rows_list]
        plan = by[r["plan_rows"]]
        print(f"| {r['tokens']} | {r['heads']} | {r['bytes'] / 1e6:.2f} | {r['copy_us']:.1f} | " + " | ".join(cells)
              + f" | {r['plan_rows']} | {r['bytes'] / plan / 1e3:.0f} | {by[1] / plan:.2f}x |")


def plot(results, path: Path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    for r in results:
        by = r["us_by_rows"]
        ax.plot(list(by), list(by.values()), marker="o", label=f"T{r['tokens']} H{r['heads']}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("heads per program")
    ax.set_ylabel("µs per Q-quant")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    save_png(fig, path, dpi=100)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="+",
                    default=["1x128", "32x128", "64x128", "128x128", "256x128", "128x64", "128x16", "1024x16"],
                    help="TxH: tokens (batch x s_q) x heads")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--out", type=Path, default=Path("bench_out"))
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    results = [time_shape(*(int(v) for v in s.split("x")), a.rows) for s in a.shapes]
    print_table(results, a.rows)
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                min_programs=decode_plan.Q_QUANT_MIN_PROGRAMS, max_rows=decode_plan.Q_QUANT_MAX_ROWS)
    (a.out / "q_quant_rows.json").write_text(json.dumps(dict(meta=meta, results=results), indent=1))
    plot(results, a.out / "q_quant_rows.png")
    print("wrote", a.out / "q_quant_rows.json", "(* = the plan's block)")


if __name__ == "__main__":
    main()
