"""Accuracy report: SnapMLA and the paper's ablation configurations A-D against a float64 golden.

    python -m study.accuracy [--layers 12 --seeds 4 --batch 4 --heads 16 --seq-len 2048 ...]
    python -m study.accuracy --checkpoint DIR [--windows 8 --window-len 1024] [--kernel]

Synthetic caches shaped like real MLA latents (see `synthetic_layer`), many layers x seeds averaged, because a
single sample is noisy when attention is peaked; or, with --checkpoint, the real per-layer activations of a trained
model (`activations.capture_decode_inputs`: the last token of held-out windows decoded against the window).
Prints a table of RMSE, 1 - cosine and relative L2 against the golden, writes JSON and a PNG plot (per-layer
error, one line per configuration, like the paper's Figure 4).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from study.ablations import CONFIGS, decode_with_config
from sglang_snapmla.layout import KV_LORA_RANK, PAGE_SIZE, ROPE_DIM
from sglang_snapmla.numerics import error_metrics, mla_decode_golden

METRICS = ("rmse", "one_minus_cos", "rel_l2")
KERNEL_ROW = "shipped kernels"  # the row `run_report(kernel=True)` adds beside the configurations


@dataclass
class SyntheticSpec:
    """Parameters of the synthetic MLA layer (all documented in docs/ACCURACY.md)."""

    batch: int = 4
    heads: int = 16
    seq_len: int = 2048  # longest sequence; others are drawn in [seq_len/4, seq_len]
    s_q: int = 1
    content_std: float = 1.5  # per-channel spread of c_kv around its shared mean
    content_mean_std: float = 1.0  # the mean component shared by all tokens (per channel)
    token_gain_sigma: float = 0.5  # log-normal per-token magnitude variation
    rope_std: float = 2.0  # scale of the heavy-tailed RoPE key
    rope_outlier: float = 1000.0  # magnitude reached by the outlier RoPE channels
    rope_outlier_channels: int = 4
    logit_std: float = 2.0  # target std of softmax logits (realistic, not argmax-like)


def synthetic_layer(spec: SyntheticSpec, generator: torch.Generator):
    """One synthetic decode problem shaped like a real MLA layer.

    * c_kv = shared per-channel mean + per-token gain (log-normal) * N(0, content_std): mostly within +-10.
    * k_rope = Student-t (3 dof) * rope_std, with a few channels scaled so their largest values reach
      ~rope_outlier (RoPE keys have a few high-energy frequency pairs), clipped at 1.2 * rope_outlier.
    * queries are Gaussian and rescaled so the exact logits have std `logit_std`.
    * pages are shuffled in the pool (scattered paging), the pool's spare slots hold random data.
    Returns (q_nope, q_rope, c_kv, k_rope, block_table, seq_lens, softmax_scale).
    """
    g = generator
    B, H, s_q = spec.batch, spec.heads, spec.s_q
    lens = torch.randint(max(s_q, spec.seq_len // 4), spec.seq_len + 1, (B,), generator=g)
    lens[0] = spec.seq_len
    pages_per_seq = math.ceil(spec.seq_len / PAGE_SIZE)
    num_pages = B * pages_per_seq + 1
    S = num_pages * PAGE_SIZE
    mean = torch.randn(KV_LORA_RANK, generator=g) * spec.content_mean_std
    gain = torch.exp(torch.randn(S, 1, generator=g) * spec.token_gain_sigma)
    c_kv = mean + gain * torch.randn(S, KV_LORA_RANK, generator=g) * spec.content_std
    k_rope = _student_t(S, ROPE_DIM, 3.0, g) * spec.rope_std
    hot = torch.randperm(ROPE_DIM, generator=g)[: spec.rope_outlier_channels]
    k_rope[:, hot] *= spec.rope_outlier / (k_rope[:, hot].abs().amax(0) + 1e-6)
    k_rope = k_rope.clamp(-1.2 * spec.rope_outlier, 1.2 * spec.rope_outlier)
    perm = torch.randperm(num_pages - 1, generator=g) + 1  # page 0 stays unused, like SGLang's dummy slot
    block_table = perm[: B * pages_per_seq].reshape(B, pages_per_seq).to(torch.int32)
    q_nope = torch.randn(B, s_q, H, KV_LORA_RANK, generator=g)
    q_rope = torch.randn(B, s_q, H, ROPE_DIM, generator=g)
    softmax_scale = 1.0 / math.sqrt(KV_LORA_RANK + ROPE_DIM)
    # rescale q so that the exact logits have the requested spread
    slots = block_table[0, :1].long() * PAGE_SIZE + torch.arange(PAGE_SIZE)
    logits = (torch.einsum("bqhd,kd->bqhk", q_nope, c_kv[slots])
              + torch.einsum("bqhd,kd->bqhk", q_rope, k_rope[slots])) * softmax_scale
    factor = spec.logit_std / logits.std().item()
    return (q_nope * factor, q_rope * factor, c_kv, k_rope, block_table, lens.to(torch.int32), softmax_scale)


def _student_t(rows: int, cols: int, dof: float, g: torch.Generator) -> torch.Tensor:
    """Student-t samples from a seeded generator: N(0,1) / sqrt(chi2(dof) / dof)."""
    z = torch.randn(rows, cols, generator=g)
    chi2 = torch.randn(rows, cols, int(dof), generator=g).pow(2).sum(-1)
    return z / torch.sqrt(chi2 / dof)


def _study_dependency(name: str):
    """A package of the `accuracy` extra (matplotlib, tqdm): imported on use, with the fix when it is missing."""
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise ImportError(f"the accuracy report needs {name.split('.')[0]}, which the serving plugin does not "
                          "depend on: pip install 'sglang-snapmla[accuracy]'") from e


def run_report(layer_inputs, layers: int, seeds: int, progress: bool = True, kernel: bool = False):
    """Per-layer metrics averaged over seeds, for every configuration (and the shipped kernels when `kernel`).

    `layer_inputs(layer, seed)` returns decode inputs in `mla_decode_golden`'s argument order.
    Returns {config: {metric: [layers]}}."""
    tqdm = _study_dependency("tqdm").tqdm

    names = list(CONFIGS) + ([KERNEL_ROW] if kernel else [])
    per_layer = {name: {m: [0.0] * layers for m in METRICS} for name in names}
    jobs = [(layer, seed) for layer in range(layers) for seed in range(seeds)]
    for layer, seed in tqdm(jobs, desc="layers x seeds", disable=not progress):
        inputs = layer_inputs(layer, seed)
        gold, _ = mla_decode_golden(*inputs)
        outs = {name: decode_with_config(cfg, *inputs)[0] for name, cfg in CONFIGS.items()}
        if kernel:
            outs[KERNEL_ROW] = _kernel_decode(*inputs)
        for name, out in outs.items():
            for metric, value in error_metrics(out, gold).items():
                per_layer[name][metric][layer] += value / seeds
    return per_layer


def synthetic_inputs(spec: SyntheticSpec, base_seed: int = 0):
    return lambda layer, seed: synthetic_layer(
        spec, torch.Generator().manual_seed(base_seed * 1_000_003 + layer * 1009 + seed))


def _kernel_decode(q_nope, q_rope, c_kv, k_rope, block_table, seq_lens, softmax_scale):
    """The shipped kernels on the same inputs (CUDA only): K-append into a pool, Q-quant + decode + combine."""
    if not torch.cuda.is_available():
        raise SystemExit("--kernel needs a CUDA GPU (the CPU interpreter path is for tests)")
    from sglang_snapmla import ops

    dev = torch.device("cuda")
    pool = ops.pool_from_rows(c_kv.to(dev, torch.bfloat16), k_rope.to(dev, torch.bfloat16))
    out, _ = ops.quantize_and_decode(q_nope.to(dev, torch.bfloat16), q_rope.to(dev, torch.bfloat16), *pool,
                                block_table.to(dev), seq_lens.to(dev), softmax_scale)
    return out.float().cpu()


def summarize(per_layer):
    return {name: {m: sum(v) / len(v) for m, v in metrics.items()} for name, metrics in per_layer.items()}


def _kernel_description() -> str:
    """Which decode ran in the kernel row: ops.decode_quantized picks the sm_90a CUDA kernel where it builds (an
    H100), else Triton; the append and Q-quant are Triton either way."""
    from sglang_snapmla import decode_plan, ops

    try:
        impl = decode_plan.decode_impl() if torch.cuda.is_available() else "triton"
    except ops.SnapMLAInputError as e:  # SNAPMLA_DECODE_IMPL=cuda without the kernel: the row was not run
        impl = f"unavailable: {e}"
    return f"the shipped kernels (Triton append and Q-quant, {impl} decode)"


def format_table(summary) -> str:
    lines = [f"| config | {'RMSE':>10} | {'1-cos':>10} | {'rel-L2':>10} | description |",
             "|---|---:|---:|---:|---|"]
    for name, m in summary.items():
        desc = CONFIGS[name].description if name in CONFIGS else _kernel_description()
        lines.append(f"| {name} | {m['rmse']:10.3e} | {m['one_minus_cos']:10.3e} | {m['rel_l2']:10.3e} | {desc} |")
    return "\n".join(lines)


def plot(per_layer, path: Path) -> None:
    _study_dependency("matplotlib").use("Agg")
    plt = _study_dependency("matplotlib.pyplot")
    MaxNLocator = _study_dependency("matplotlib.ticker").MaxNLocator

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    titles = {"rmse": "RMSE", "one_minus_cos": "1 - cosine", "rel_l2": "relative L2"}
    for ax, metric in zip(axes, METRICS):
        for name, metrics in per_layer.items():
            ys = metrics[metric]
            main = name == "SnapMLA"  # drawn on top: the other RoPE-aware rows often overlap it
            ax.plot(range(len(ys)), ys, marker="o", ms=3, label=name, lw=2.2 if main else 1.2, zorder=3 if main else 2)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_yscale("log")
        ax.set_xlabel("layer")
        ax.set_title(titles[metric] + " vs float64 golden")
        ax.grid(alpha=0.3, which="both")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> None:
    spec_defaults = SyntheticSpec()
    p = argparse.ArgumentParser(prog="python -m study.accuracy", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=12, help="synthetic layers (each its own distribution draw)")
    p.add_argument("--seeds", type=int, default=4, help="seeds averaged per layer")
    p.add_argument("--seed", type=int, default=0, help="base seed")
    for field, value in asdict(spec_defaults).items():
        p.add_argument("--" + field.replace("_", "-"), type=type(value), default=value)
    p.add_argument("--checkpoint", type=Path, default=None,
                   help="trained checkpoint (tools/train_tiny_mla.py): real activations instead of synthetic ones")
    p.add_argument("--windows", type=int, default=8, help="with --checkpoint: held-out windows (batch)")
    p.add_argument("--window-len", type=int, default=1024, help="with --checkpoint: tokens per window")
    p.add_argument("--kernel", action="store_true",
                   help="also run the shipped kernels on the same inputs (CUDA only; the decode that "
                        "ops.decode_quantized picks)")
    p.add_argument("--out", type=Path, default=Path("accuracy_report"), help="folder for JSON and PNG")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    spec = SyntheticSpec(**{f: getattr(args, f) for f in asdict(spec_defaults)})
    t0 = time.time()
    if args.checkpoint:  # real activations of a trained model: one draw per layer
        from study.activations import capture_decode_inputs

        held = json.loads((args.checkpoint / "heldout.json").read_text())
        windows = [w[:args.window_len] for w in held["ppl_windows"][:args.windows]]
        captured = capture_decode_inputs(args.checkpoint, windows)
        args.layers, args.seeds = len(captured), 1
        layer_inputs = lambda layer, seed: captured[layer]  # noqa: E731
    else:
        layer_inputs = synthetic_inputs(spec, args.seed)
    per_layer = run_report(layer_inputs, args.layers, args.seeds, progress=not args.no_progress, kernel=args.kernel)
    summary = summarize(per_layer)
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"source": str(args.checkpoint) if args.checkpoint else "synthetic", "spec": asdict(spec),
              "layers": args.layers, "seeds": args.seeds, "base_seed": args.seed,
              "summary": summary, "per_layer": per_layer, "seconds": time.time() - t0}
    (args.out / "accuracy.json").write_text(json.dumps(result, indent=1))
    plot(per_layer, args.out / "accuracy.png")
    print(format_table(summary))
    print(f"\n{args.layers} layers x {args.seeds} seeds, {time.time() - t0:.1f} s; "
          f"wrote {args.out / 'accuracy.json'} and {args.out / 'accuracy.png'}")


if __name__ == "__main__":
    main()
