"""Serving where prefills reuse a cached prefix: shared system prompts, multi-turn conversations, long prompts
prefilled in chunks, and a decode-heavy row for reference, each backend's server started once and every workload
run against it through `python -m sglang.bench_serving` (its own datasets, unchanged).

    python -m benchmarks.serve_prefix --model configs/models/deepseek-v2-lite-shape \\
        --backends snapmla snapmla-mha flashmla flashmla-fp8 --out prefix_v2lite
    python -m benchmarks.serve_prefix --merge prefix_v2lite/serve_prefix.json prefix_v3/serve_prefix.json --out docs/...

Workloads (WORKLOADS; all requests sent at once, so TTFT includes the wait for a prefill slot):
* shared-4k / shared-16k: `generated-shared-prefix`, groups of requests sharing a 4k / 16k-token system prompt, short
  questions (bench_serving's shared-prefix dataset; every request after a group's first is a prefix hit);
* multi-turn: the same dataset with `--gsp-num-turns 6`: each conversation sends its next turn after the previous
  answer, its history (system prompt, earlier questions and answers) growing to ~30k tokens, the working set sized
  between flashmla BF16's pool and snapmla's on the V2-Lite shape at the server's 0.80 memory fraction;
* long-64k: prompts of 65 536 token ids, 16 output tokens (a RAG-style document), prefilled in SGLang's 8 192-token
  chunks: every chunk after the first is an extend over the cached earlier chunks;
* decode-heavy: random prompts of 1 024 in / 1 024 out, the rows earlier tables measure.

Before each workload the radix cache is flushed (no hits carried over) and an unmeasured run of a few of its
requests compiles what the measured one needs. Per row: output and total tok/s, TTFT p50 / p99, TPOT p50, the
prompt tokens served from the cache (bench_serving's `--cache-report`), the peak running batch and the measured run's
prefill batches with the seconds they span (server log: with every request sent at once, the span is the server's
intake of them, and a TTFT near it was set by the intake, not by the engine), the GPU seconds in prefill and decode forwards (the server's device timer, `harness.gpu_time`) and their share of the
run's duration ("GPU busy": near 100 % the row is bound by the engine's forwards, well below it by what lies outside
them -- the server's intake and tokenization, the streamed output path). Prints a table with
ratios against flashmla BF16 and SGLang's FP8 (`flashmla-fp8`) of the same model, writes serve_prefix.json and
serve_prefix.png.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

from harness import gpu_time
from harness.bench_serving import METRICS, parse_metrics
from harness.results import load_results, save_png, stored
from harness.server_log import peak_running_requests, pool_tokens, prefill_intake, read_log
from harness.server import RUN_ENV, RUNS, flush_cache, kill_servers_on_exit, start_server, stop_server, wait_healthy

GSP = "generated-shared-prefix"
WORKLOADS = {  # name -> bench_serving dataset and its arguments
    "shared-4k": dict(dataset=GSP, num_groups=32, prompts_per_group=16, system_prompt_len=4096, question_len=128,
                      output_len=256),
    "shared-16k": dict(dataset=GSP, num_groups=16, prompts_per_group=16, system_prompt_len=16384, question_len=256,
                       output_len=256),
    "multi-turn": dict(dataset=GSP, num_groups=8, prompts_per_group=6, system_prompt_len=16384, question_len=2048,
                       output_len=512, num_turns=6),
    "long-64k": dict(dataset="random-ids", input_len=65536, output_len=16, num_prompts=16),
    "decode-heavy": dict(dataset="random-ids", input_len=1024, output_len=1024, num_prompts=512),
}
REFERENCE, FP8_REFERENCE = "flashmla", "flashmla-fp8"
CONTEXT_LENGTH = 131072  # long-64k and the multi-turn histories fit
WARMUP_REQUESTS = 8
EXTRA_METRICS = {
    "p99_ttft_ms": r"P99 TTFT \(ms\):\s+([\d.]+)",
    "mean_ttft_ms": r"Mean TTFT \(ms\):\s+([\d.]+)",
    "peak_output_tok_s": r"Peak output token throughput \(tok/s\):\s+([\d.]+)",
    "cached_tokens": r"Total cached tokens:\s+(\d+)",
    "prompt_tokens": r"Total prompt tokens:\s+(\d+)",
    "requests": r"Successful requests:\s+(\d+)",
}


def bench_command(port: int, model: str, workload: dict, seed: int = 1, warmup: bool = False) -> list[str]:
    """`python -m sglang.bench_serving` for a workload (warmup: a few of its requests, 8 output tokens)."""
    w = dict(workload)
    # bench_serving runs multi-turn conversations through the chat API only
    api = "sglang-oai-chat" if w.get("num_turns", 1) > 1 and not warmup else "sglang"
    cmd = [sys.executable, "-m", "sglang.bench_serving", "--backend", api, "--port", str(port), "--tokenizer",
           model, "--dataset-name", w["dataset"], "--seed", str(seed), "--cache-report"]
    output_len = 8 if warmup else w["output_len"]
    if w["dataset"] == GSP:
        groups, per_group = (1, min(WARMUP_REQUESTS, w["prompts_per_group"])) if warmup else \
            (w["num_groups"], w["prompts_per_group"])
        cmd += ["--gsp-num-groups", str(groups), "--gsp-prompts-per-group", str(per_group),
                "--gsp-system-prompt-len", str(w["system_prompt_len"]), "--gsp-question-len",
                str(w["question_len"]), "--gsp-output-len", str(output_len),
                "--gsp-num-turns", str(1 if warmup else w.get("num_turns", 1)),
                "--num-prompts", str(groups * per_group)]
    else:  # token ids sent as ids: exact lengths (text would be re-tokenized ~11 % longer)
        prompts = max(1, min(WARMUP_REQUESTS, w["num_prompts"] // 8)) if warmup else w["num_prompts"]
        cmd += ["--random-input-len", str(w["input_len"]), "--random-output-len", str(output_len),
                "--random-range-ratio", "1.0", "--tokenize-prompt", "--num-prompts", str(prompts)]
    return cmd


def parse(text: str) -> dict:
    """bench_serving's summary -> harness.bench_serving's METRICS plus EXTRA_METRICS (None where a line is missing)."""
    return parse_metrics(text, {**METRICS, **EXTRA_METRICS})


def run_workload(port: int, model: str, backend: str, name: str, out: Path, timeout: float, log_path: Path) -> dict:
    workload = WORKLOADS[name]
    subprocess.run(bench_command(port, model, workload, seed=2, warmup=True), capture_output=True, timeout=timeout)
    flush_cache(port)
    first_line = len(log_path.read_text(errors="replace").splitlines())
    before = gpu_time.server_seconds(port)
    b = subprocess.run(bench_command(port, model, workload), capture_output=True, text=True, timeout=timeout)
    after = gpu_time.server_seconds(port)
    (out / f"bench_{Path(model).name}_{backend}_{name}.txt").write_text(b.stdout + b.stderr)
    metrics = parse(b.stdout)
    if not metrics.get("output_tok_s") or not metrics.get("retokenized_output_tokens"):
        raise RuntimeError(f"{name}: bench_serving returned no results (rc {b.returncode}): "
                           f"{(b.stdout + b.stderr)[-400:]}")
    grown = {c: after.get(c, 0.0) - before.get(c, 0.0) for c in after}
    metrics["gpu_prefill_s"] = round(sum(grown.get(c, 0.0) for c in gpu_time.PREFILL_CATEGORIES), 2)
    metrics["gpu_decode_s"] = round(sum(grown.get(c, 0.0) for c in gpu_time.DECODE_CATEGORIES), 2)
    measured = "\n".join(log_path.read_text(errors="replace").splitlines()[first_line:])
    metrics["peak_running"] = peak_running_requests(measured)
    metrics.update(prefill_intake(measured))
    print(json.dumps({"model": model, "backend": backend, "workload": name, **metrics}), flush=True)
    return metrics


def run_backend(model: str, backend: str, workloads: list[str], out: Path, port: int, args, on_workload) -> dict:
    log_path = out / f"server_{Path(model).name}_{backend}.log"
    flags = [*gpu_time.SERVER_FLAGS, *RUNS[backend], *shlex.split(args.server_flags)]
    proc, log = start_server(model, port, flags, log_path, context_length=CONTEXT_LENGTH,
                             env={**RUN_ENV.get(backend, {}), **gpu_time.SERVER_ENV})
    res: dict = {"cmd": proc.cmd, "workloads": {}}
    try:
        wait_healthy(port, proc, args.startup_timeout)
        res["pool_tokens"] = pool_tokens(log_path.read_text(errors="replace"))
        for name in workloads:
            try:
                res["workloads"][name] = run_workload(port, model, backend, name, out, args.bench_timeout, log_path)
            except (RuntimeError, subprocess.TimeoutExpired) as e:  # recorded; the other workloads still run
                res["error"] = f"{res.get('error', '')}{name}: {e!r}"[:600] + "; "
            on_workload(res)
    except Exception as e:  # recorded in the table, never hidden
        res["error"] = repr(e)[:300]
    finally:
        stop_server(proc, log)
    return res


def _ratio(value, base) -> str:
    return f"{value / base:.2f}x" if value and base else "-"


def _busy(m: dict) -> str:
    """The share of the run's duration the GPU spent in forwards (the two timers overlap a little: up to ~105 %)."""
    if m.get("gpu_prefill_s") is None or m.get("gpu_decode_s") is None or not m.get("duration_s"):
        return "-"
    return f"{(m['gpu_prefill_s'] + m['gpu_decode_s']) / m['duration_s']:.0%}"


def reparse(results: dict, folder: Path) -> dict:
    """`results` with each row's bench_serving metrics read again from its saved output in `folder` (bench_*.txt), so
    that a table gains the metrics parse() learned after the run; the server-side fields stay as measured. The
    outputs kept under results/ are xz-compressed (`stored`)."""
    for model, backends in results.items():
        for backend, run in backends.items():
            for name, m in run.get("workloads", {}).items():
                saved = stored(folder / f"bench_{Path(model).name}_{backend}_{name}.txt")
                if saved.exists():
                    m.update({k: v for k, v in parse(read_log(saved)).items() if v is not None})
    return results


def _intake(m: dict) -> str:
    """The measured run's prefill batches and their span (`harness.server_log.prefill_intake`), '-' before it."""
    if m.get("prefill_batches") is None:
        return "-"
    span = m.get("prefill_span_s")
    return f"{m['prefill_batches']} / {span:.0f}" if span is not None else f"{m['prefill_batches']} / -"


def table(results: dict) -> str:
    """Markdown: one row per (model, workload, backend), ratios of output tok/s and of median TTFT against flashmla
    BF16 and SGLang FP8 of the same model."""
    lines = ["| model | workload | backend | output tok/s | total tok/s | TTFT p50 / mean / p99 s | TPOT p50 ms | "
             "cached / prompt tokens | peak running | prefill batches / span s | GPU s prefill / decode | GPU busy | "
             "output vs BF16 / vs FP8 | TTFT p50 / mean vs BF16 |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for model, backends in results.items():
        for name in WORKLOADS:
            ref = backends.get(REFERENCE, {}).get("workloads", {}).get(name, {})
            fp8 = backends.get(FP8_REFERENCE, {}).get("workloads", {}).get(name, {})
            for backend, run in backends.items():
                m = run.get("workloads", {}).get(name)
                if not m:
                    continue
                ttft = " / ".join(f"{m[k] / 1e3:.2f}" if m.get(k) is not None else "-"
                                  for k in ("median_ttft_ms", "mean_ttft_ms", "p99_ttft_ms"))
                lines.append(
                    f"| {Path(model).name} | {name} | {backend} | {m['output_tok_s']:.0f} | {m['total_tok_s']:.0f} | "
                    f"{ttft} | {m.get('median_tpot_ms')} | {m.get('cached_tokens') or 0:.0f} / "
                    f"{m.get('prompt_tokens') or 0:.0f} | {m.get('peak_running')} | {_intake(m)} | "
                    f"{m.get('gpu_prefill_s')} / "
                    f"{m.get('gpu_decode_s')} | {_busy(m)} | {_ratio(m['output_tok_s'], ref.get('output_tok_s'))} / "
                    f"{_ratio(m['output_tok_s'], fp8.get('output_tok_s'))} | "
                    f"{_ratio(m.get('median_ttft_ms'), ref.get('median_ttft_ms'))} / "
                    f"{_ratio(m.get('mean_ttft_ms'), ref.get('mean_ttft_ms'))} |")
        for backend, run in backends.items():
            if run.get("error"):
                lines.append(f"| {Path(model).name} | - | {backend} | error: {run['error']} | | | | | | | | | | |")
            if run.get("pool_tokens"):
                lines.append(f"| {Path(model).name} | pool | {backend} | {run['pool_tokens']} tokens | | | | | | | | | | |")
    return "\n".join(lines)


def plot(results: dict, path: Path) -> Path:
    """Output tok/s and median TTFT per workload, one bar per backend, one panel pair per model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(results), 2, figsize=(13, 3.6 * len(results)), squeeze=False)
    for row, (model, backends) in enumerate(results.items()):
        names = [w for w in WORKLOADS if any(w in r.get("workloads", {}) for r in backends.values())]
        width = 0.8 / max(1, len(backends))
        for k, (key, label) in enumerate((("output_tok_s", "output tok/s"), ("median_ttft_ms", "median TTFT (ms)"))):
            ax = axes[row][k]
            for j, (backend, run) in enumerate(backends.items()):
                values = [run.get("workloads", {}).get(w, {}).get(key) or 0 for w in names]
                ax.bar([i + j * width for i in range(len(names))], values, width, label=backend,
                       color=f"C{list(RUNS).index(backend) % 10}")
            ax.set_xticks([i + width * (len(backends) - 1) / 2 for i in range(len(names))], names)
            ax.set_ylabel(label)
            ax.set_title(Path(model).name)
            if key == "median_ttft_ms":
                ax.set_yscale("log")
            ax.legend(fontsize=8)
    fig.tight_layout()
    save_png(fig, path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="configs/models/deepseek-v2-lite-shape")
    ap.add_argument("--backends", nargs="+", default=["snapmla", "flashmla", "flashmla-fp8"], choices=list(RUNS))
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    ap.add_argument("--server-flags", default="", help='more server flags in one string, e.g. "--tp 2 ..."')
    ap.add_argument("--resume", action="store_true", help="keep (model, backend, workload) results already in --out")
    ap.add_argument("--merge", nargs="+", type=Path, help="only merge these serve_prefix.json files, table + plot")
    ap.add_argument("--redraw", action="store_true",
                    help="only the table and plot of --out's serve_prefix.json, its metrics read again from the saved "
                         "bench_serving outputs beside it")
    ap.add_argument("--startup-timeout", type=float, default=900)
    ap.add_argument("--bench-timeout", type=float, default=900)
    ap.add_argument("--port", type=int, default=22000)
    ap.add_argument("--out", type=Path, default=Path("prefix_out"))
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    saved = args.out / "serve_prefix.json"
    if args.redraw and not stored(saved).exists():
        raise SystemExit(f"--redraw: no {saved}")
    results = load_results(saved, args.merge, args.resume or args.redraw)
    if args.redraw:
        results = reparse(results, args.out)
    elif not args.merge:
        kill_servers_on_exit()
        for i, backend in enumerate(args.backends):
            done = results.get(args.model, {}).get(backend, {}).get("workloads", {})
            todo = [w for w in args.workloads if w not in done]
            if not todo:
                continue

            def save(res, backend=backend, done=done):  # after every workload: a cut-off run keeps what it measured
                results.setdefault(args.model, {})[backend] = {**res, "workloads": {**done, **res["workloads"]}}
                saved.write_text(json.dumps(results, indent=1))

            save(run_backend(args.model, backend, todo, args.out, args.port + i, args, save))
    saved.write_text(json.dumps(results, indent=1))
    print(table(results))
    print("plot:", plot(results, args.out / "serve_prefix.png"))


if __name__ == "__main__":
    main()
