"""SnapMLA against SGLang's own FP8 MLA cache on activations with realistic outliers, through the server.

    python -m tools.fp8_outlier_sweep --model CKPT --out sweep_out \
        --runs flashmla flashmla-fp8 snapmla snapmla-triton --alphas 1 8 128 1024 --latent-spread 16
    python -m tools.fp8_outlier_sweep --model CKPT --out latent_out --alphas --betas 0.00390625 0.0625 1 16
    python -m tools.fp8_outlier_sweep --model CKPT --out latent_out --alphas --betas 0.00390625 1 16 --runs \
        --kernel-level

CKPT is a trained checkpoint (tools/train_tiny_mla.py). The sweep serves the same model at several activation
magnitudes: `original`, and for each alpha the function-preserving reparameterization of harness/reparameterize.py
(RoPE key x alpha, query RoPE / alpha, latent channels spread over --latent-spread) and for each beta the latent
scale (c_KV x beta, kv_b_proj / beta, so the absorbed query grows by 1 / beta). In exact arithmetic, and in
BF16 too since every factor is a power of two, each point is the same model; a cache format with a fixed range is
what tells them apart.

Per point, on the GPU (`--kernel-level`): the activation ranges an FP8 cache meets (largest |k_rope|, |c_KV|, query
values; the share of K values torch's float8 cast turns into NaN, above 464, and of latent values under FP8's
normal range, 2^-6) and the decode error of each attention
path against the float64 golden on the model's own activations (the last token of held-out windows):
FlashMLA BF16, FlashMLA FP8 fed as SGLang's flashmla backend feeds it (the pool's plain cast of all 576 dims,
`scaled_fp8_quant` of Q with scale 1.0, descales 1.0: what SGLang does when a checkpoint has no k_scale), the
SnapMLA spec and the shipped SnapMLA kernels.

Per run (one server each, started once; the points are loaded in turn with SGLang's /update_weights_from_disk, which
copies into the captured CUDA graphs' weights in place): held-out perplexity (windows prefilled in 128-token chunks,
so every chunk after the first reads the earlier ones from the pool), teacher-forced agreement (prompt + the
reference's greedy continuation prefilled; the argmax at each continuation position against the reference's token),
and the serving gate's probes (tools/accuracy_gate.py: greedy, logprobs) alone and inside 512 concurrent requests.
The first run is the reference (flashmla BF16); every metric compares with the reference at the same point. A
reload that does not take effect would make every point look alike: after `original`, each server loads a control
checkpoint that is a different model (the RoPE key x 8 without the query's compensation) and the sweep stops if
the probes' output does not change.
With `--concurrent` the runs after the reference are served side by side on the same GPU (each pool has a fixed
size, so they fit), run i on --port + PORT_STRIDE x i: the sweep then takes two server lifetimes instead of one per run.
Writes fp8_outlier_sweep.json (results accumulate: a run already measured is kept) and fp8_outlier_sweep.png,
prints the tables.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from harness.server import PORT_STRIDE, RUN_ENV, RUNS, greedy_generate, kill_servers_on_exit, post, serving
from harness import reparameterize
from harness.probes import POOL_FLAGS, PROBES, agreement, generate_level, held, token_errors, workload
from harness.results import read_json, save_png

ORIGINAL, CONTROL = "original", "control"
FORCED_PROMPTS, FORCED_TOKENS = 16, 1024
CONCURRENT = 512
TORCH_FP8_NAN_ABOVE = 464.0  # torch's float8_e4m3fn cast: |x| >= 464 (past 448's rounding range) becomes NaN
FP8_MIN_NORMAL = 2.0**-6
FLOOR_DRAWN = 1e-5  # a zero error on the log axis
PATHS = ("flashmla-bf16", "flashmla-fp8", "snapmla-spec", "snapmla-kernels")


def point_name(alpha: float) -> str:
    return f"alpha={alpha:g}"


def beta_name(beta: float) -> str:
    return f"beta=1/{1 / beta:g}" if beta < 1 else f"beta={beta:g}"


def make_points(model: Path, work: Path, alphas: list[float], spread: float,
                betas: list[float] = ()) -> dict[str, Path]:
    """{point: checkpoint dir}: the original, one reparameterized copy per alpha (latent spread on each) and one per
    latent scale beta (nothing else changed)."""
    points = {ORIGINAL: model}
    for a in alphas:
        points[point_name(a)] = reparameterize.write_checkpoint(model, work / f"alpha{a:g}", a, spread)
    for b in betas:
        points[beta_name(b)] = reparameterize.write_checkpoint(model, work / f"beta{b:g}", latent_scale=b)
    return points


def make_control(model: Path, work: Path) -> Path:
    """A different model (RoPE key x 8, query left as it is): loading it must change the probes' outputs."""
    return reparameterize.write_checkpoint(model, work / CONTROL, alpha=8.0, edit=reparameterize.uncompensated_query)


# ----------------------------------------------------------------------------------------------------------
# Kernel level (GPU): activation ranges and decode error against the float64 golden
# ----------------------------------------------------------------------------------------------------------
def activation_ranges(q_nope, q_rope, c_kv, k_rope, *_) -> dict:
    """What a fixed-range FP8 cache meets in one layer's decode inputs."""
    k = torch.cat([c_kv.float(), k_rope.float()], -1)
    q = torch.cat([q_nope.float(), q_rope.float()], -1)
    qr = q_rope.float().abs()
    return {"k_rope_amax": float(k_rope.float().abs().max()), "c_kv_amax": float(c_kv.float().abs().max()),
            "q_amax": float(q.abs().max()), "q_rope_median": float(qr.median()),
            "k_nan_in_fp8_cast": float((k.abs() >= TORCH_FP8_NAN_ABOVE).float().mean()),
            "c_kv_subnormal_in_fp8": float((c_kv.float().abs() < FP8_MIN_NORMAL).float().mean()),
            "q_rope_subnormal_in_fp8": float((qr < FP8_MIN_NORMAL).float().mean())}


def _flashmla(q_nope, q_rope, c_kv, k_rope, block_table, seq_lens, softmax_scale, fp8: bool):
    """FlashMLA (sgl_kernel) on the layer's inputs; fp8=True feeds it as SGLang's flashmla backend does with
    --kv-cache-dtype fp8_e4m3 and no k_scale in the checkpoint."""
    from sgl_kernel.flash_mla import flash_mla_with_kvcache, get_mla_metadata

    dev = torch.device("cuda")
    q = torch.cat([q_nope, q_rope], -1).to(dev, torch.bfloat16)
    kv = torch.cat([c_kv, k_rope], -1).to(dev, torch.bfloat16)
    bt, lens = block_table.to(dev), seq_lens.to(dev)
    B, s_q, H, _ = q.shape
    md, ns = get_mla_metadata(lens, s_q * H, 1, is_fp8_kvcache=fp8)
    extra = {}
    if fp8:
        from sglang.kernels.ops.quantization.fp8_kernel import scaled_fp8_quant

        one = torch.ones(1, dtype=torch.float32, device=dev)
        q = scaled_fp8_quant(q.reshape(-1, q.shape[-1]), one)[0].reshape(q.shape)  # flashmla_backend's Q path
        kv = kv.to(torch.float8_e4m3fn)  # MLATokenToKVPool's write: a plain cast
        extra = {"descale_q": one, "descale_k": one}
    out, _ = flash_mla_with_kvcache(q, kv.view(-1, 64, 1, kv.shape[-1]), bt, lens, 512, md, ns,
                                    softmax_scale=softmax_scale, causal=True, **extra)
    return out.float().cpu()


def path_output(path: str, inputs) -> torch.Tensor:
    from study import ablations, accuracy

    if path == "snapmla-spec":
        return ablations.decode_with_config("SnapMLA", *inputs)[0]
    if path == "snapmla-kernels":
        return accuracy._kernel_decode(*inputs)
    return _flashmla(*inputs, fp8=path == "flashmla-fp8")


def kernel_level(model_dir: Path, windows: list[list[int]], paths=PATHS) -> dict:
    """Per layer: activation ranges, and per path rel-L2 / 1-cos against the float64 golden (NaN stays NaN)."""
    from study.activations import capture_decode_inputs
    from sglang_snapmla.numerics import error_metrics, mla_decode_golden

    device = "cuda" if torch.cuda.is_available() else "cpu"
    layers = capture_decode_inputs(model_dir, windows, device=device)
    out = {"ranges": [], "errors": {p: [] for p in paths}}
    for inputs in layers:
        out["ranges"].append(activation_ranges(*inputs))
        gold, _ = mla_decode_golden(*inputs)
        for p in paths:
            o = path_output(p, inputs)
            out["errors"][p].append({**error_metrics(o, gold), "nan_rows": float(o.isnan().any(-1).float().mean())})
    return out


# ----------------------------------------------------------------------------------------------------------
# Through the server
# ----------------------------------------------------------------------------------------------------------
def load_point(port: int, path: Path) -> None:
    r = post(port, "/update_weights_from_disk", {"model_path": str(path), "load_format": "auto"}, timeout=600)
    if not r.get("success"):
        raise RuntimeError(f"/update_weights_from_disk {path}: {r.get('message')}")


def scored_perplexity(port: int, windows: list[list[int]]) -> dict:
    """Held-out perplexity from prompt logprobs; a position whose logprob is not finite (NaN comes back as null)
    makes it infinite and is counted."""
    with ThreadPoolExecutor(64) as ex:
        scored = list(ex.map(lambda w: greedy_generate(port, w, 1, return_logprob=True, logprob_start_len=0), windows))
    lps = [t[0] for r in scored for t in r["meta_info"]["input_token_logprobs"][1:]]  # the first has none
    bad = sum(lp is None or not math.isfinite(lp) for lp in lps)
    ppl = math.inf if bad else math.exp(-sum(lps) / len(lps))
    return {"perplexity": ppl, "nonfinite_positions": bad, "positions": len(lps)}


def teacher_forced(port: int, prompts: list[list[int]], continuations: list[list[int]]) -> list[list[int]]:
    with ThreadPoolExecutor(len(prompts)) as ex:
        forced = list(ex.map(lambda pc: greedy_generate(port, pc[0] + pc[1], 1, return_logprob=True,
                                                        logprob_start_len=len(pc[0]) - 1, top_logprobs_num=1),
                             zip(prompts, continuations)))
    # the top-1 token at each continuation position (end-aligned); a position without one (NaN logits) is -1
    return [[pos[0][1] if pos else -1 for pos in r["meta_info"]["input_top_logprobs"][-len(c):]]
            for r, c in zip(forced, continuations)]


def measure_point(port: int, held: dict, reference_continuations: list[list[int]] | None) -> dict:
    probes, fillers = workload(held, CONCURRENT - PROBES)
    prompts = held["prompts"][:FORCED_PROMPTS]
    res = scored_perplexity(port, held["ppl_windows"])
    if reference_continuations is None:  # the reference run's first point: its continuations are everybody's
        with ThreadPoolExecutor(len(prompts)) as ex:
            reference_continuations = [r["output_ids"] for r in
                                       ex.map(lambda p: greedy_generate(port, p, FORCED_TOKENS), prompts)]
        res["continuations"] = reference_continuations
    res["teacher_forced"] = teacher_forced(port, prompts, reference_continuations)
    res["alone"] = generate_level(port, probes, fillers, 1)
    res[f"c{CONCURRENT}"] = generate_level(port, probes, fillers, CONCURRENT)
    return res


def serve_run(name: str, points: dict[str, Path], control: Path, held: dict, port: int, log_dir: Path,
              reference_continuations, startup_timeout: float) -> dict:
    graph_bs = sorted({*(2**k for k in range(10)), 160, CONCURRENT} - {1024})
    flags = [*RUNS[name], "--cuda-graph-bs", *map(str, graph_bs), "--max-running-requests", str(CONCURRENT),
             # a pool of a fixed size (tools/accuracy_gate.py says why); two sweeps then also share one GPU
             "--chunked-prefill-size", "128", "--mem-fraction-static", "0.9", *POOL_FLAGS]
    first = next(iter(points.values()))
    out = {"points": {}}
    with serving(str(first), port, flags, log_dir / f"server_{name}.log", startup_timeout, load_format="auto",
                 context_length=4096, env=RUN_ENV.get(name)):
        greedy_generate(port, held["prompts"][0], 4)  # JIT builds before anything is measured
        t0 = time.time()
        for i, (point, path) in enumerate(points.items()):
            if i:
                load_point(port, path)
            out["points"][point] = measure_point(port, held, reference_continuations)
            reference_continuations = reference_continuations or out["points"][point].get("continuations")
            if point == ORIGINAL:
                load_point(port, control)
                probes, fillers = workload(held, CONCURRENT - PROBES)
                changed = generate_level(port, probes, fillers, 1)
                if changed == out["points"][point]["alone"]:
                    raise RuntimeError("loading a different model through /update_weights_from_disk left the probes' "
                                       "outputs unchanged: the reload does not reach the served weights")
        out["seconds"] = round(time.time() - t0, 1)
    return out


# ----------------------------------------------------------------------------------------------------------
# Tables
# ----------------------------------------------------------------------------------------------------------
def point_rows(results: dict, runs: list[str]) -> list[dict]:
    """One row per (point, run): each metric against the reference run (runs[0]) at the same point."""
    ref_name = runs[0]
    ref = results["runs"][ref_name]["points"]
    cont = next(p["continuations"] for p in ref.values() if "continuations" in p)
    rows = []
    for point in ref:
        for name in runs:
            r = results["runs"].get(name, {}).get("points", {}).get(point)
            if r is None:
                continue
            alone, _ = token_errors(r["alone"], ref[point]["alone"])
            busy, same = token_errors(r[f"c{CONCURRENT}"], ref[point][f"c{CONCURRENT}"])
            rows.append({"point": point, "run": name,
                         "ppl_ratio": r["perplexity"] / ref[point]["perplexity"],
                         "nonfinite_positions": r["nonfinite_positions"],
                         "teacher_forced": agreement(r["teacher_forced"], cont),
                         "dlogprob_alone": alone, f"dlogprob_c{CONCURRENT}": busy,
                         f"identical_c{CONCURRENT}": same, "probes": len(r["alone"]),
                         f"held_c{CONCURRENT}": held(r[f"c{CONCURRENT}"])})
    return rows


def format_serving(rows: list[dict]) -> str:
    lines = [f"| point | run | ppl / BF16 | non-finite logprobs | teacher-forced agreement | mean abs dlogprob alone | "
             f"mean abs dlogprob in {CONCURRENT} | identical probes in {CONCURRENT} |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['point']} | {r['run']} | {r['ppl_ratio']:.4f} | {r['nonfinite_positions']} | "
                     f"{100 * r['teacher_forced']:.1f} % | {r['dlogprob_alone']:.4f} | "
                     f"{r[f'dlogprob_c{CONCURRENT}']:.4f} | {r[f'identical_c{CONCURRENT}']}/{r['probes']} |")
    return "\n".join(lines)


def format_kernel(kernel: dict) -> str:
    # the latent's share under 2^-6: a column where every point measured it (sweeps saved before it have none)
    latent = all("c_kv_subnormal_in_fp8" in r for k in kernel.values() for r in k["ranges"])
    lines = ["| point | max k_rope | max c_KV | max q | K values NaN in torch's fp8 cast | query RoPE below 2^-6 | "
             + ("c_KV below 2^-6 | " if latent else "") + " | ".join(f"{p} rel-L2" for p in PATHS) + " |",
             "|---|---:|---:|---:|---:|---:|" + "---:|" * (len(PATHS) + latent)]
    for point, k in kernel.items():
        rng = k["ranges"]
        errs = [statistics.fmean(layer["rel_l2"] for layer in k["errors"][p]) for p in PATHS]
        lines.append(f"| {point} | {max(r['k_rope_amax'] for r in rng):.3g} | {max(r['c_kv_amax'] for r in rng):.3g} | "
                     f"{max(r['q_amax'] for r in rng):.3g} | "
                     f"{100 * statistics.fmean(r['k_nan_in_fp8_cast'] for r in rng):.3f} % | "
                     f"{100 * statistics.fmean(r['q_rope_subnormal_in_fp8'] for r in rng):.1f} % | "
                     + (f"{100 * statistics.fmean(r['c_kv_subnormal_in_fp8'] for r in rng):.1f} % | " if latent else "")
                     + " | ".join(f"{e:.3e}" for e in errs) + " |")
    return "\n".join(lines)


def plot(rows: list[dict], kernel: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = list(dict.fromkeys(r["point"] for r in rows)) or list(kernel)  # a kernel-level-only sweep: its points
    titles = ("perplexity / flashmla BF16 (inf drawn at 1e3)",
              f"mean |dlogprob| vs BF16, probes in {CONCURRENT} requests\n(inf drawn at 1e3, 0 at {FLOOR_DRAWN:g})",
              "decode rel-L2 vs float64 golden (NaN output drawn at 1)")
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.4)) if rows else plt.subplots(1, 1, figsize=(7, 4.4))
    axes = list(axes) if rows else [None, None, axes]  # no serving rows: the kernel panel alone
    x = range(len(points))
    for name in dict.fromkeys(r["run"] for r in rows):
        mine = {r["point"]: r for r in rows if r["run"] == name}
        cap = lambda v: min(v, 1e3)  # noqa: E731  (an infinite error is drawn at the top of the axis)
        axes[0].plot(x, [cap(mine[p]["ppl_ratio"]) if p in mine else math.nan for p in points], marker="o", label=name)
        axes[1].plot(x, [max(cap(mine[p][f"dlogprob_c{CONCURRENT}"]), FLOOR_DRAWN) if p in mine else math.nan
                         for p in points], marker="o", label=name)
    for p in PATHS:
        if kernel:  # a NaN output (rel-L2 NaN) is drawn at the top, like an infinite error
            errs = [statistics.fmean(l["rel_l2"] for l in kernel[pt]["errors"][p]) if pt in kernel else math.inf
                    for pt in points]
            axes[2].plot(x, [1.0 if math.isnan(e) else e for e in errs], marker="o", label=p)
    for ax, title in zip(axes, titles):
        if ax is None:
            continue
        ax.set_xticks(list(x), points, rotation=20)
        ax.set_yscale("log")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.tight_layout()
    save_png(fig, path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, help="checkpoint dir written by tools/train_tiny_mla.py (required unless "
                    "--redraw)")
    ap.add_argument("--out", type=Path, default=Path("sweep_out"))
    ap.add_argument("--runs", nargs="*", default=["flashmla", "flashmla-fp8", "snapmla", "snapmla-triton"],
                    choices=list(RUNS), help="the first is the reference; none: the kernel level only (no server)")
    ap.add_argument("--alphas", nargs="*", type=float, default=[1.0, 8.0, 128.0, 1024.0])
    ap.add_argument("--betas", nargs="*", type=float, default=[],
                    help="latent scales (powers of two), e.g. 0.00390625 0.0625 1 16: the latent-magnitude sweep")
    ap.add_argument("--latent-spread", type=float, default=16.0)
    ap.add_argument("--kernel-level", action="store_true", help="activation ranges and decode error (GPU)")
    ap.add_argument("--kernel-windows", type=int, default=8)
    ap.add_argument("--concurrent", action="store_true",
                    help="after the reference run, serve the other runs at once on the same GPU, each measured by its "
                         "own client (the pools are of a fixed size: they fit side by side)")
    ap.add_argument("--port", type=int, default=24000, help="run i serves on port + PORT_STRIDE x i")
    ap.add_argument("--startup-timeout", type=float, default=600)
    ap.add_argument("--redraw", type=Path, default=None,
                    help="print the tables and draw the plot of a saved fp8_outlier_sweep.json; serves nothing")
    args = ap.parse_args(argv)
    if args.redraw:  # a saved sweep, or its xz-compressed copy (results/accuracy)
        report(read_json(args.redraw), args.runs, Path(str(args.redraw).removesuffix(".xz")).with_suffix(".png"))
        return
    if args.model is None:
        ap.error("--model is required (or --redraw a saved sweep)")
    if not args.runs and not args.kernel_level:
        ap.error("--runs is empty and --kernel-level is not set: nothing to measure")
    args.out.mkdir(parents=True, exist_ok=True)
    kill_servers_on_exit()
    held = json.loads((args.model / "heldout.json").read_text())
    points = make_points(args.model, args.out / "checkpoints", args.alphas, args.latent_spread, args.betas)
    control = make_control(args.model, args.out / "checkpoints")
    saved = args.out / "fp8_outlier_sweep.json"
    results = json.loads(saved.read_text()) if saved.exists() else {}
    results.update({"model": str(args.model), "alphas": args.alphas, "betas": args.betas,
                    "latent_spread": args.latent_spread})
    results.setdefault("runs", {})
    if args.kernel_level and "kernel" not in results:
        windows = [w for w in held["ppl_windows"][:args.kernel_windows]]
        results["kernel"] = {p: kernel_level(path, windows) for p, path in points.items()}
        torch.cuda.empty_cache()  # the servers get the GPU's memory
        saved.write_text(json.dumps(results))
    pending = []
    for i, name in enumerate(args.runs):
        if "points" in results["runs"].get(name, {}):
            print(f"{name}: kept from {saved}", flush=True)
        else:
            pending.append((i, name))
    lock = threading.Lock()

    def measure(job, cont):
        i, name = job
        try:
            run = serve_run(name, points, control, held, args.port + PORT_STRIDE * i, args.out, cont,
                            args.startup_timeout)
        except Exception as e:  # reported in the table
            run = {"error": repr(e)[:400]}
            print(f"{name}: {run['error']}", flush=True)
        with lock:
            results["runs"][name] = run
            saved.write_text(json.dumps(results))

    if pending and pending[0][0] == 0:  # the reference first: the others are scored against its continuations
        measure(pending.pop(0), None)
    ref = results["runs"].get(args.runs[0], {}).get("points", {}) if args.runs else {}
    cont = next((p["continuations"] for p in ref.values() if "continuations" in p), None)
    if pending and cont is None:
        raise SystemExit(f"the reference run {args.runs[0]} has no result: run it first")
    with ThreadPoolExecutor(len(pending) if args.concurrent and pending else 1) as ex:
        list(ex.map(lambda job: measure(job, cont), pending))
    results["rows"] = report(results, args.runs, args.out / "fp8_outlier_sweep.png")
    saved.write_text(json.dumps(results))


def report(results: dict, runs: list[str], png: Path) -> list[dict]:
    """Print the kernel-level and serving tables of a sweep's results, draw the plot; returns the serving rows."""
    measured = [r for r in runs if "points" in results["runs"].get(r, {})]
    rows = point_rows(results, measured) if measured and measured[0] == runs[0] else []
    reference = runs[0] if runs else "(no run served)"
    print(f"\nmodel {results['model']}; latent spread {results['latent_spread']:g}; reference {reference}")
    if "kernel" in results:
        print("\n" + format_kernel(results["kernel"]))
    print("\n" + format_serving(rows))
    short = [f"{r['point']} {r['run']}: {k}/{n}" for r in rows for k, n in [r[f"held_c{CONCURRENT}"]] if k < n]
    if short:  # those probes decoded in a smaller batch than CONCURRENT (harness/probes.generate_level)
        print(f"probes that decoded among fewer than all fillers in {CONCURRENT}: " + "; ".join(short))
    for name in runs:
        if "error" in results["runs"].get(name, {}):
            print(f"{name}: error: {results['runs'][name]['error']}")
    plot(rows, results.get("kernel", {}), png)
    return rows


if __name__ == "__main__":
    main()
