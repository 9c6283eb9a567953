"""One attention layer of an eager decode step, snapmla against FlashMLA BF16 (GPU host, after
`source tools/gpu_host/env.sh`):

    python3 -m benchmarks.gpu.eager_layer [--heads 16 128] [--batches 1 64 512 1024 1500] [--seq-len 1536] [--out DIR]

A batch above SGLang's largest captured decode graph runs every layer eagerly: the host issues each layer's kernels
while the GPU runs the previous ones, and a step is as slow as the slower of the two. Per (heads, batch), the layer as
each backend runs it in an eager step (the step's plan made once, outside the layer, as the backends do):
  snapmla  : the pool's K-append (`library.append_kv`, B new tokens), Q-quant, decode (+ combine when split)
  flashmla : SGLang's pool write (`set_mla_kv_buffer_triton`, bf16) + `flash_mla_with_kvcache` (SGLang 0.5.17's)
  flashmla_fp8 : SGLang's FP8 path (`--kv-cache-dtype fp8_e4m3`, no k_scale): the new K cast to FP8 and written, the
             three unit scales allocated, Q cast by `scaled_fp8_quant`, FP8 `flash_mla_with_kvcache`
Columns: host_us, the host time to issue one layer (20 layers issued back to back, timed before the synchronization,
so the GPU's queue absorbs them); gpu_us, the GPU time of one layer (CUDA graph of 20 layers, median of 15
replays). Where host_us > gpu_us, an eager step of that batch waits on the host for attention.
Prints a table, writes eager_layer.json and eager_layer.png under --out (`--redraw JSON`: the table and the PNG of a
saved run, no GPU needed)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from harness.kernel_timing import host_us, make_inputs, time_graph
from harness.results import read_json, save_png
from sglang_snapmla import decode_plan, library, ops

ISSUED = 20  # layers issued back to back per host-time measurement, well inside the GPU's launch queue


def measure(heads: int, batch: int, seq_len: int) -> dict:
    from sgl_kernel.flash_mla import flash_mla_with_kvcache, get_mla_metadata
    from sglang.srt.mem_cache.utils import set_mla_kv_buffer_triton

    x = make_inputs(batch, seq_len, heads, 1, 1, "cuda")[0]
    scale = 576 ** -0.5
    lens = torch.full((batch,), seq_len, dtype=torch.int32, device="cuda")
    table = x["bt"]
    new_k = torch.randn(batch, 576, dtype=torch.bfloat16, device="cuda")
    loc = (table[:, -1].long() * 64 + (seq_len - 1) % 64)  # each sequence's last slot, where its new token goes
    q_nope, q_rope = x["q"][..., :512].reshape(batch, heads, 512), x["q"][..., 512:].reshape(batch, heads, 64)
    plan = decode_plan.plan_decode(batch, 1, heads, table.shape[1], lens.device)
    ops.check_decode_step(table, lens, plan, x["kv8"].shape[0])

    def snapmla():  # backend.SnapMLAForward._save + _attend, the step's plan made once
        library.append_kv(new_k[:, :512], new_k[:, 512:], loc, x["kv8"], x["ks"], x["kr"])
        library.quantize_and_decode(q_nope, q_rope, x["kv8"], x["ks"], x["kr"], table, lens, scale, plan)

    kv = x["ckv"].view(-1, 1, 576)
    metadata, splits = get_mla_metadata(lens, heads, 1)  # per step in FlashMLA's backend

    def flashmla():  # flashmla_backend.forward_decode with the pool's set_mla_kv_buffer
        set_mla_kv_buffer_triton(kv, loc, new_k[:, None, :512], new_k[:, None, 512:])
        flash_mla_with_kvcache(x["q"], kv.view(-1, 64, 1, 576), table, lens, 512, metadata, splits,
                               softmax_scale=scale, causal=True)

    from sglang.kernels.ops.quantization.fp8_kernel import scaled_fp8_quant

    kv8 = x["ckv"].to(torch.float8_e4m3fn).view(-1, 1, 576)
    metadata8, splits8 = get_mla_metadata(lens, heads, 1, is_fp8_kvcache=True)

    def flashmla_fp8():  # flashmla_backend.forward_decode with an FP8 pool (memory_pool._write_mla_kv_buffer)
        nope, rope = new_k[:, None, :512].to(torch.float8_e4m3fn), new_k[:, None, 512:].to(torch.float8_e4m3fn)
        set_mla_kv_buffer_triton(kv8.view(torch.uint8), loc, nope.view(torch.uint8), rope.view(torch.uint8))
        q_scale, descale_q, descale_k = (torch.ones((1,), dtype=torch.float32, device="cuda") for _ in range(3))
        q8, _ = scaled_fp8_quant(x["q"].reshape(-1, 576), q_scale)
        flash_mla_with_kvcache(q8.view(x["q"].shape), kv8.view(-1, 64, 1, 576), table, lens, 512, metadata8, splits8,
                               softmax_scale=scale, causal=True, descale_q=descale_q, descale_k=descale_k)

    row = {"heads": heads, "batch": batch, "seq_len": seq_len, "splits": plan.splits}
    for name, layer in (("snapmla", snapmla), ("flashmla", flashmla), ("flashmla_fp8", flashmla_fp8)):
        row[f"{name}_host_us"] = round(host_us(layer, ISSUED, warmup=3, issue_only=True), 2)
        row[f"{name}_gpu_us"] = round(time_graph(lambda _, layer=layer: layer, 1), 2)
    return row


BACKENDS = ("snapmla", "flashmla", "flashmla_fp8")


def table(rows: list[dict]) -> str:
    """Markdown: one line per (heads, batch), a host and a GPU column per backend measured (a run saved before the
    FP8 layer existed has two backends)."""
    names = [b for b in BACKENDS if all(f"{b}_host_us" in r for r in rows)]
    lines = ["| heads | batch | splits | " + " | ".join(f"{b} host µs | {b} GPU µs" for b in names) + " |",
             "|---:|---:|---:|" + "---:|---:|" * len(names)]
    lines += [f"| {r['heads']} | {r['batch']} | {r['splits']} | "
              + " | ".join(f"{r[f'{b}_host_us']:.0f} | {r[f'{b}_gpu_us']:.1f}" for b in names) + " |" for r in rows]
    return "\n".join(lines)


def plot(rows: list[dict], gpu: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len({r["heads"] for r in rows}), figsize=(11, 3.8), squeeze=False)
    for ax, heads in zip(axes[0], sorted({r["heads"] for r in rows})):
        sel = [r for r in rows if r["heads"] == heads]
        xs = range(len(sel))
        bars = [(n, w) for n in BACKENDS for w in ("host", "gpu") if f"{n}_{w}_us" in sel[0]]
        width = 0.8 / len(bars)
        for k, (name, what) in enumerate(bars):
            ax.bar([x + (k - (len(bars) - 1) / 2) * width for x in xs], [r[f"{name}_{what}_us"] for r in sel], width,
                   label=f"{name} {what}")
        ax.set_xticks(list(xs), [str(r["batch"]) for r in sel])
        ax.set_yscale("log")
        ax.set_xlabel("batch")
        ax.set_ylabel("µs per layer")
        ax.set_title(f"{heads} heads, {sel[0]['seq_len']} keys")
        ax.legend(fontsize=7)
    fig.suptitle(f"one eager attention layer: host issue time and GPU time ({gpu})", fontsize=10)
    fig.tight_layout()
    save_png(fig, path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--heads", type=int, nargs="+", default=[16, 128])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 64, 512, 1024, 1500])
    ap.add_argument("--seq-len", type=int, default=1536)
    ap.add_argument("--out", type=Path, default=Path("eager_layer_out"))
    ap.add_argument("--redraw", type=Path, help="only draw the PNG from this eager_layer.json (no GPU needed)")
    args = ap.parse_args(argv)
    if args.redraw:
        saved = read_json(args.redraw)
        print(table(saved["rows"]))
        plot(saved["rows"], saved["gpu"], args.redraw.with_suffix(".png"))
        return 0
    rows = []
    for heads in args.heads:
        for batch in args.batches:
            rows.append(measure(heads, batch, args.seq_len))
            print(table(rows[-1:]).splitlines()[-1], flush=True)
            torch.cuda.empty_cache()
    gpu = torch.cuda.get_device_name()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "eager_layer.json").write_text(json.dumps({"gpu": gpu, "rows": rows}, indent=1))
    plot(rows, gpu, args.out / "eager_layer.png")
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
