"""The end-to-end throughput matrix: each backend's server started once, every workload run against it.

    python -m benchmarks.serve_matrix --model configs/models/deepseek-v2-lite-shape \
        --backends snapmla flashmla flashmla-fp8 triton --out matrix_v2lite
    python -m benchmarks.serve_matrix --model configs/models/deepseek-v3-shape --backends snapmla flashmla \
        --out matrix_v3
    python -m benchmarks.serve_matrix --merge matrix_v2lite/serve_matrix.json matrix_v3/serve_matrix.json --out results/serve

Workloads (`python -m sglang.bench_serving`, random-ids, range ratio 1.0): throughput at in 4096 / out 512 / 320
prompts, in 32768 / out 1024 / 64 prompts, in 1024 / out 1024 / 512 prompts, and latency (in 4096 / out 512) at
--max-concurrency 1 and 8. On a host with a time limit per command, pass a subset with --workloads / --backends and
--resume (results already in --out are kept), or merge the JSON of several runs. Prints a table (ratios vs
flashmla BF16 of the same model, targets marked), writes serve_matrix.json and two PNGs (throughput and median
TPOT vs context length, per backend).

Before each measured workload the server sees the same prompts (same seed, length and concurrency; at most 16 of
them, 8 output tokens), then its radix cache is flushed: the Triton kernels SGLang compiles per token count at first
use (its fused MoE: ~1-2 s each) are compiled outside the measurement, whichever backend runs first on a
machine, and no workload starts with prefix hits from an earlier one. Each workload records the Triton kernels
still JIT-compiled while it ran (new entries in TRITON_CACHE_DIR), listed under the table. A workload named twice
runs twice on the same server (the repeat is recorded as NAME#2).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from harness.bench_serving import CONTEXT_LENGTH, bench_serving, ttft_outliers
from harness.results import load_results, save_png
from harness.server_log import pool_tokens
from harness.server import RUN_ENV, RUNS, flush_cache, kill_servers_on_exit, start_server, stop_server, wait_healthy

WORKLOADS = {  # name -> bench_serving arguments
    "in4096-out512": dict(input_len=4096, output_len=512, num_prompts=320),
    "in32768-out1024": dict(input_len=32768, output_len=1024, num_prompts=64),
    "in1024-out1024": dict(input_len=1024, output_len=1024, num_prompts=512),
    "latency-c1": dict(input_len=4096, output_len=512, num_prompts=8, max_concurrency=1),
    "latency-c8": dict(input_len=4096, output_len=512, num_prompts=32, max_concurrency=8),
    # the same without streaming: at ~18-20 k output tok/s (V2-Lite, 512 streams) the frontend and the client, not
    # the engine, set the streamed run's duration (docs/BENCHMARKS.md); TTFT and TPOT are then not
    # measured (bench_serving reports the whole request as the first token)
    "in1024-out1024-nostream": dict(input_len=1024, output_len=1024, num_prompts=512, stream=False),
}
# targets for snapmla: total tok/s vs flashmla BF16 (latency-c1: "no worse than 1.0x")
TARGETS = {"in4096-out512": 1.6, "in32768-out1024": 1.8, "latency-c1": 1.0}
REFERENCE = "flashmla"
# the same FlashMLA decode with snapmla's prefill routing (serve_and_bench.RUNS): the ratio to it is the decode's and
# the pool's share alone (docs/BENCHMARKS.md)
SAME_PREFILL_REFERENCE = "flashmla-mhaprefill"
CUDA_GRAPH_MAX_BS = 512  # above the largest admitted batch (512 prompts), or decode runs eagerly
SHAPE_WARMUP_PROMPTS, SHAPE_WARMUP_OUTPUT = 16, 8


def streamed(workload: str) -> bool:
    """Whether bench_serving streams the workload's responses (TTFT / TPOT / ITL measured)."""
    return WORKLOADS.get(workload, {}).get("stream", True)


def shape_warmup(workload: dict) -> dict:
    """bench_serving arguments of the unmeasured run before `workload`: its first prompts (same seed, length and
    concurrency), few output tokens. Prefill token counts of the measured run are then compiled for."""
    return {**workload, "num_prompts": min(workload["num_prompts"], SHAPE_WARMUP_PROMPTS),
            "output_len": SHAPE_WARMUP_OUTPUT}


def triton_cache_entries(cache_dir: Path | None = None) -> set[str]:
    """Names ("HASH/kernel") of the compiled kernels in Triton's cache: one metadata JSON per compiled variant."""
    cache_dir = cache_dir or Path(os.environ.get("TRITON_CACHE_DIR", Path.home() / ".triton" / "cache"))
    if not cache_dir.is_dir():
        return set()
    return {f"{p.parent.name}/{p.stem}" for p in cache_dir.glob("*/*.json") if not p.name.startswith("__grp__")}


def compiled_kernels(before: set[str], after: set[str]) -> list[str]:
    """Kernel names compiled between two `triton_cache_entries` snapshots (sorted, one per variant)."""
    return sorted(entry.split("/", 1)[1] for entry in after - before)


def run_key(name: str, done: dict) -> str:
    """The results key of a run of workload `name`: NAME, then NAME#2, NAME#3 ... for repeats on one server."""
    key, k = name, 1
    while key in done:
        k += 1
        key = f"{name}#{k}"
    return key


def run_workload(port: int, model: str, backend: str, name: str, key: str, out: Path, bench_timeout: float) -> dict:
    """One measured workload (after its shape warm-up and a cache flush) -> its metrics; raw output under `out`."""
    tag = key.replace("#", "_run")
    bench_serving(port, model, timeout=bench_timeout, **shape_warmup(WORKLOADS[name]))
    flush_cache(port)
    before = triton_cache_entries()
    metrics, text = bench_serving(port, model, timeout=bench_timeout, **WORKLOADS[name],
                                  details=out / f"details_{Path(model).name}_{backend}_{tag}.jsonl")
    metrics["jit_compiled"] = compiled_kernels(before, triton_cache_entries())
    (out / f"bench_{Path(model).name}_{backend}_{tag}.txt").write_text(text)
    print(json.dumps({"model": model, "backend": backend, "workload": key,
                      **{k: v for k, v in metrics.items() if not isinstance(v, list)}}), flush=True)
    return metrics


def run_backend(model: str, backend: str, workloads: list[str], out: Path, port: int, startup_timeout: float,
                bench_timeout: float, warmup_input_len: int = 1024, on_workload=None) -> dict:
    """One server, all `workloads` against it -> {"pool_tokens", "startup_s", "workloads": {name: metrics}}.
    on_workload(res), if given, runs after each workload with the results so far, so that a run cut short by a
    time limit keeps what it measured (`--resume` then runs only the rest)."""
    log_path = out / f"server_{Path(model).name}_{backend}.log"
    proc, log = start_server(model, port, ["--cuda-graph-max-bs", str(CUDA_GRAPH_MAX_BS), *RUNS[backend]], log_path,
                             context_length=CONTEXT_LENGTH, env=RUN_ENV.get(backend))
    res: dict = {"cmd": proc.cmd, "workloads": {}}
    try:
        wait_healthy(port, proc, startup_timeout)
        res["pool_tokens"] = pool_tokens(log_path.read_text(errors="replace"))  # logged before the server is up
        # unmeasured warm-up: first-use JIT builds (FlashInfer prefill, Triton variants) stay out of the numbers
        bench_serving(port, model, warmup_input_len, 16, 4, bench_timeout, seed=2)
        for name in workloads:
            key = run_key(name, res["workloads"])
            try:
                res["workloads"][key] = run_workload(port, model, backend, name, key, out, bench_timeout)
            except RuntimeError as e:  # a workload the server rejected: recorded, the others still run
                res["error"] = f"{res.get('error', '')}{key}: {e}; "
            if on_workload:
                on_workload(res)
    except Exception as e:  # recorded in the table, never hidden
        res["error"] = repr(e)[:300]
    finally:
        stop_server(proc, log)
    res["pool_tokens"] = pool_tokens(log_path.read_text(errors="replace"))
    return res


def table(results: dict) -> str:
    """Markdown: one row per (model, workload, backend); ratios vs the same model's flashmla BF16 run and vs its
    flashmla run with MHA prefill (where measured)."""
    lines = ["| model | workload | backend | total tok/s | output tok/s | median TPOT ms | median ITL ms | "
             "median TTFT ms | pool tokens | total vs flashmla BF16 | vs flashmla, MHA prefill | target |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for model, backends in results.items():
        for wl, key in _table_keys(backends):
            for name, r in backends.items():
                m = r.get("workloads", {}).get(key)
                if m is None:
                    continue
                ratio, same_prefill = (_ratio(m, backends.get(ref, {}), wl)
                                       for ref in (REFERENCE, SAME_PREFILL_REFERENCE))
                target = TARGETS.get(wl) if name.startswith("snapmla") else None
                verdict = "" if target is None or ratio is None else \
                    f"{'met' if ratio >= target else 'not met'} (>= {target}x)"
                # without streaming bench_serving's TTFT is the whole request and TPOT / ITL are meaningless
                lat = [m.get(k) if streamed(wl) else "-"
                       for k in ("median_tpot_ms", "median_itl_ms", "median_ttft_ms")]
                lines.append(f"| {Path(model).name} | {key} | {name} | {m.get('total_tok_s')} | {m.get('output_tok_s')} "
                             f"| {lat[0]} | {lat[1]} | {lat[2]} | "
                             f"{r.get('pool_tokens')} | {_fmt(ratio)} | {_fmt(same_prefill)} | {verdict} |")
        for _, key in _table_keys(backends):  # a median hides a few slow requests: list them (latency above all)
            for name, r in backends.items():
                slow = ttft_outliers(r.get("workloads", {}).get(key, {}))
                if slow:
                    lines.append(f"| {Path(model).name} | {key} | {name} | TTFT > 5x median: " + ", ".join(
                        f"request {i} ({n} tokens) {t:.2f} s" for i, n, t in slow) + " | | | | | | | | |")
                compiled = r.get("workloads", {}).get(key, {}).get("jit_compiled")
                if compiled:
                    lines.append(f"| {Path(model).name} | {key} | {name} | JIT-compiled during the run: "
                                 + ", ".join(compiled) + " | | | | | | | | |")
        for name, r in backends.items():
            if "error" in r:
                lines.append(f"| {Path(model).name} | - | {name} | error: {r['error']} | | | | | | | | |")
    return "\n".join(lines)


def _ratio(m: dict, ref: dict, workload: str) -> float | None:
    """Total tok/s of `m` over the reference run's at the workload's first run; None where either is missing."""
    base = ref.get("workloads", {}).get(workload, {}).get("total_tok_s")
    return m["total_tok_s"] / base if base and m.get("total_tok_s") else None


def _fmt(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"


def _table_keys(backends: dict) -> list[tuple[str, str]]:
    """(workload, results key) in WORKLOADS order, repeats (NAME#k) after their first run."""
    keys = {k for r in backends.values() for k in r.get("workloads", {})}
    return [(wl, k) for wl in WORKLOADS for k in sorted(keys, key=lambda k: (len(k), k))
            if k == wl or k.startswith(wl + "#")]


def plot(results: dict, out: Path) -> list[Path]:
    """Total tok/s and median TPOT vs input length (the three throughput workloads), one line per backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    throughput = [w for w, a in WORKLOADS.items() if "max_concurrency" not in a and streamed(w)]
    # models with at least one throughput point (a latency-only run has nothing to draw against context length)
    results = {m: b for m, b in results.items()
               if any(w in r.get("workloads", {}) for r in b.values() for w in throughput)}
    paths = []
    if not results:
        return paths
    for key, label, fname in (("total_tok_s", "total tok/s", "serve_matrix_throughput.png"),
                              ("median_tpot_ms", "median TPOT (ms)", "serve_matrix_tpot.png")):
        fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4), squeeze=False)
        for ax, (model, backends) in zip(axes[0], results.items()):
            for name, r in backends.items():
                pts = sorted((WORKLOADS[w]["input_len"], r["workloads"][w][key]) for w in throughput
                             if r.get("workloads", {}).get(w, {}).get(key) is not None)
                if pts:  # one color per backend in every panel (the order of RUNS)
                    ax.plot(*zip(*pts), marker="o", label=name, color=f"C{list(RUNS).index(name) % 10}")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("input length (tokens)")
            ax.set_ylabel(label)
            ax.set_title(Path(model).name)
            ax.legend()
        fig.tight_layout()
        paths.append(out / fname)
        save_png(fig, paths[-1], dpi=110)
        plt.close(fig)
    return paths


def main(argv: list[str] | None = None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="configs/models/deepseek-v2-lite-shape")
    ap.add_argument("--backends", nargs="+", default=["snapmla", "flashmla", "flashmla-fp8", "triton"],
                    choices=list(RUNS))
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS),
                    help="a name given twice runs twice on the same server (NAME#2)")
    ap.add_argument("--warmup-input-len", type=int, default=1024,
                    help="input length of the unmeasured 16-prompt warm-up after server start")
    ap.add_argument("--resume", action="store_true", help="keep (model, backend) results already in --out")
    ap.add_argument("--merge", nargs="+", type=Path, help="only merge these serve_matrix.json files, table + plots")
    ap.add_argument("--startup-timeout", type=float, default=600)
    ap.add_argument("--bench-timeout", type=float, default=600)
    ap.add_argument("--out", type=Path, default=Path("matrix_out"))
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    saved = args.out / "serve_matrix.json"
    results = load_results(saved, args.merge, args.resume)
    if not args.merge:
        kill_servers_on_exit()
        for i, backend in enumerate(args.backends):
            done = results.get(args.model, {}).get(backend, {})
            todo = [w for w in args.workloads if w not in done.get("workloads", {})]
            if not todo and "error" not in done:
                continue
            def save(r, backend=backend, done=done):  # the workloads of earlier calls stay
                results.setdefault(args.model, {})[backend] = {**r, "workloads": {**done.get("workloads", {}),
                                                                                  **r["workloads"]}}
                saved.write_text(json.dumps(results, indent=1))

            save(run_backend(args.model, backend, todo, args.out, 31000 + i, args.startup_timeout,
                             args.bench_timeout, args.warmup_input_len, on_workload=save))
    saved.write_text(json.dumps(results, indent=1))
    print(table(results))
    print("plots:", *plot(results, args.out))


if __name__ == "__main__":
    main()
