"""What FlashMLA's tile-scheduler metadata costs a snapmla decode step, which never reads it (GPU host, after
`source tools/gpu_host/env.sh`):

    python3 -m benchmarks.gpu.step_metadata [--heads 128 16] [--batches 1 128] [--seq-len 4096] [--out DIR]

The snapmla backend inherits FlashMLA's forward metadata: besides the block table (which the decode reads), FlashMLA's
metadata code computes its own kernel's tile schedule (`get_mla_metadata`) and, under CUDA graphs, copies it into
static buffers before every replay; snapmla's backend answers that call with placeholders (`backend.
skip_flashmla_schedule`). Per (heads, batch), on the GPU:
  flashmla_schedule_us : host time per step of what FlashMLA does for the schedule before a graph replay (the int32
                         cast of the lengths, `get_mla_metadata`, the two copies into its static buffers), launches
                         back to back, then synchronized: the larger of host and GPU time per step
  left_of_schedule_us  : the same code as snapmla's backend runs it, `get_mla_metadata` answered by
                         `SnapMLAForward.unread_schedule` (views of the static buffers, copied into themselves): the
                         cast is what is left
  snapmla_plan_us      : host time of the snapmla step plan (`decode_plan.plan_decode` + `ops.check_decode_step`)
  attention_layer_us   : one layer's snapmla decode (Q-quant + decode + combine, CUDA graph of 20 calls, median of
                         15 replays, as benchmarks/bench_kernels.py), at seq-len keys per sequence
  schedule_share       : flashmla_schedule_us / (layers x attention_layer_us): an upper bound on the step time the
                         schedule takes (a step also runs the model's other layers), for DeepSeek-V3's 61 layers
Prints a table, writes step_metadata.json and step_metadata.png under --out (`--redraw JSON` draws the PNG where
matplotlib is, e.g. from a GPU host's JSON)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import SimpleNamespace

import torch

from harness.kernel_timing import host_us, make_inputs, time_graph
from harness.results import save_png
from sglang_snapmla import decode_plan, ops
from sglang_snapmla.backend import SnapMLAForward

V3_LAYERS = 61


def measure(heads: int, batch: int, seq_len: int) -> dict:
    from sgl_kernel.flash_mla import get_mla_metadata  # SGLang 0.5.17's FlashMLA, as its flashmla backend calls it

    x = make_inputs(batch, seq_len, heads, 1, 1, "cuda")[0]
    lens64 = torch.full((batch,), seq_len, dtype=torch.int64, device="cuda")  # SGLang's lengths are int64
    schedule, splits = get_mla_metadata(lens64.to(torch.int32), heads, 1)
    static_schedule, static_splits = torch.empty_like(schedule), torch.empty_like(splits)

    def flashmla_schedule():  # flashmla_backend._apply_decode_target_verify_metadata's schedule part
        s, n = get_mla_metadata(lens64.to(torch.int32), heads, 1)
        static_schedule[: s.shape[0]].copy_(s)
        static_splits.copy_(n)

    graph_metadata = SimpleNamespace(cuda_graph_mla_metadata=static_schedule, cuda_graph_num_splits=static_splits)

    def left_of_schedule():  # the same lines, get_mla_metadata answered as snapmla's backend answers it
        lens64.to(torch.int32)
        s, n = SnapMLAForward.unread_schedule(graph_metadata, batch, graphed=True)
        static_schedule[: s.shape[0]].copy_(s)
        static_splits[: batch + 1].copy_(n)

    lens32 = lens64.to(torch.int32)
    table = x["bt"]

    def snapmla_plan():
        plan = decode_plan.plan_decode(batch, 1, heads, table.shape[1], lens32.device)
        ops.check_decode_step(table, lens32, plan, x["kv8"].shape[0])

    qn, qr = x["q"][..., :512], x["q"][..., 512:]
    q_nope, q_rope = qn.reshape(batch, 1, heads, -1), qr.reshape(batch, 1, heads, -1)

    def layer():
        ops.quantize_and_decode(q_nope, q_rope, x["kv8"], x["ks"], x["kr"], table, lens32, 576 ** -0.5)

    schedule_us, left_us, plan_us = (host_us(fn, calls=200, warmup=10)
                                     for fn in (flashmla_schedule, left_of_schedule, snapmla_plan))
    layer_us = time_graph(lambda _: layer, 1)
    return {"heads": heads, "batch": batch, "seq_len": seq_len, "flashmla_schedule_us": round(schedule_us, 2),
            "left_of_schedule_us": round(left_us, 2), "snapmla_plan_us": round(plan_us, 2),
            "attention_layer_us": round(layer_us, 2),
            "schedule_share": round(schedule_us / (V3_LAYERS * layer_us), 5)}


def plot(rows: list[dict], gpu: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"h{r['heads']} b{r['batch']}" for r in rows]
    xs = range(len(rows))
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.bar([x - 0.27 for x in xs], [r["flashmla_schedule_us"] for r in rows], 0.27, label="FlashMLA schedule / step")
    ax.bar(list(xs), [r["left_of_schedule_us"] for r in rows], 0.27, label="left of it in snapmla / step")
    ax.bar([x + 0.27 for x in xs], [r["snapmla_plan_us"] for r in rows], 0.27, label="snapmla plan / step")
    ax.set_xticks(list(xs), labels)
    ax.set_ylabel("µs per step")
    ax.set_title(f"per-step metadata beside one attention layer ({gpu})")
    for x, r in zip(xs, rows):
        ax.annotate(f"layer {r['attention_layer_us']:.0f} µs", (x, 0), textcoords="offset points", xytext=(0, -28),
                    ha="center", fontsize=7)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_png(fig, path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--heads", type=int, nargs="+", default=[128, 16])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 128])
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--out", type=Path, default=Path("step_metadata_out"))
    ap.add_argument("--redraw", type=Path, help="only draw the PNG from this step_metadata.json (no GPU needed)")
    args = ap.parse_args(argv)
    if args.redraw:
        saved = json.loads(args.redraw.read_text())
        plot(saved["rows"], saved["gpu"], args.redraw.with_suffix(".png"))
        return 0
    rows = [measure(h, b, args.seq_len) for h in args.heads for b in args.batches]
    print(f"{torch.cuda.get_device_name()}, {args.seq_len} keys per sequence, decode {decode_plan.decode_impl()}")
    print("| heads | batch | FlashMLA schedule µs/step | left of it in snapmla µs/step | snapmla plan µs/step | "
          f"attention µs/layer | schedule share of {V3_LAYERS} layers' attention |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['heads']} | {r['batch']} | {r['flashmla_schedule_us']} | {r['left_of_schedule_us']} | "
              f"{r['snapmla_plan_us']} | {r['attention_layer_us']} | {100 * r['schedule_share']:.2f} % |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "step_metadata.json").write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "rows": rows},
                                                            indent=1))
    try:
        plot(rows, torch.cuda.get_device_name(), args.out / "step_metadata.png")
    except ImportError:
        print("matplotlib is not installed here: draw the PNG with --redraw step_metadata.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
