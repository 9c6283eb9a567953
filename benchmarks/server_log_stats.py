"""Engine-side numbers of a measured run, from an SGLang server log (the `server_*.log` that serve_matrix.py and
serve_and_bench.py keep next to each benchmark), for telling the engine's rate from what the client saw:

    python -m benchmarks.server_log_stats results/serve/v2lite_h100_in4096/server_*.log.xz   (plain or xz-compressed)

Per log: the peak number of running requests, the decode rate near that peak (the fifth-highest `gen throughput`
line: the top few are short bursts at the end of a run), the decode step at the peak (the median of running requests
x accept length / generation rate over the decode lines within 5 % of the peak batch that follow no prefill batch:
the intervals decoded alone; with a speculative draft a step is a verify cycle), the largest KV-pool usage, and the
measured run's prefill phase: from the first prefill batch with at least `--min-queue` requests waiting (the
throughput workloads send all their prompts at once; the harness's warm-ups send at most 16) to the last prefill
batch, in whole seconds (the log's resolution), and the median rate of its prefill batches
(`harness.server_log.prefill_intake`).
Prints a markdown table.

    python -m benchmarks.server_log_stats --startup LOG...

Where a server's start went instead (`startup_report`): from its first log line to "fired up", SGLang's own engine
timings (weights, KV pool, scheduler, decode graph capture, tokenizer) and the longest silences between two log
lines, each with the line that ended it (a JIT build logs nothing while it compiles).

Under DP attention every rank logs its own batches, tagged `DPn` (`decode_lines`' "rank")."""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from harness.server_log import (BATCH_LINE, decode_lines, field, peak_running_requests, prefill_intake, read_log,
                                startup_report)


def decode_step_ms_at_peak(decodes: list[dict]) -> float | None:
    """Median of 1000 x running requests x accept length / generation rate over `decode_lines` within 5 % of the peak
    batch that follow no prefill batch; None for a log without a rated decode line. Under speculative decoding a
    request gains the accept length per step, so the step is a verify cycle (the target's verify and the draft's
    steps), the unit a step without a draft compares with."""
    rated = [d for d in decodes if d["rate"]]
    if not rated:
        return None
    peak = max(d["running"] for d in rated)
    alone = [1000 * d["running"] * d["accept"] / d["rate"] for d in rated
             if d["running"] >= 0.95 * peak and not d["prefill_tokens"]]
    return statistics.median(alone) if alone else None


def decode_step_fit(decodes: list[dict], min_running: int = 32) -> dict | None:
    """Least squares of the decode step (1000 x running / rate, ms) on the running requests, over `decode_lines` with
    at least `min_running` running that follow no prefill batch: {"fixed_ms", "per_request_us", "lines", "rms_ms",
    "tokens_per_request": (least, most)}. What a step costs whatever the batch, apart from what each request adds;
    where every request holds about as many tokens, a request's cost includes its cached tokens'. None below three
    such lines."""
    pts = [(d["running"], 1000 * d["running"] / d["rate"], d["tokens"] / d["running"]) for d in decodes
           if d["rate"] and d["running"] >= min_running and not d["prefill_tokens"]]
    if len(pts) < 3:
        return None
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    slope, fixed = statistics.linear_regression(xs, ys)
    rms = statistics.fmean([(fixed + slope * x - y) ** 2 for x, y in zip(xs, ys)]) ** 0.5
    per_req = [p[2] for p in pts]
    return {"fixed_ms": fixed, "per_request_us": 1000 * slope, "lines": len(pts), "rms_ms": rms,
            "tokens_per_request": (min(per_req), max(per_req))}


def log_stats(text: str, min_queue: int = 32) -> dict:
    """-> {"peak_running", "decode_tok_s_near_peak", "decode_step_ms_at_peak", "max_token_usage", "prefill_span_s",
    "prefill_batches", "prefill_tok_s_median"}."""
    decodes = decode_lines(text)
    decode_rates = sorted(d["rate"] for d in decodes if d["rate"] is not None)
    usage = [u for line in text.splitlines() if BATCH_LINE.match(line)
             for u in [field(line, "token usage")] if u is not None]
    intake = prefill_intake(text, min_queue)
    return {
        "peak_running": peak_running_requests(text),  # None for a server that never decoded
        "decode_tok_s_near_peak": decode_rates[-min(5, len(decode_rates))] if decode_rates else None,
        "decode_step_ms_at_peak": decode_step_ms_at_peak(decodes),
        "max_token_usage": max(usage, default=None),
        "prefill_span_s": intake["prefill_span_s"],
        "prefill_batches": intake["prefill_batches"],
        "prefill_tok_s_median": intake["prefill_tok_s_median"],
    }


def main(argv: list[str] | None = None):
    ap = argparse.ArgumentParser()
    ap.add_argument("logs", nargs="+", type=Path)
    ap.add_argument("--min-queue", type=int, default=32, help="waiting requests that mark the measured run's start")
    ap.add_argument("--startup", action="store_true", help="where each server's start went (startup_report)")
    ap.add_argument("--step-fit", action="store_true",
                    help="the decode step as a fixed part plus a cost per running request (decode_step_fit)")
    args = ap.parse_args(argv)
    if args.step_fit:
        print("| log | lines | fixed ms | per running request µs | rms ms | cached tokens a request |")
        print("|---|---:|---:|---:|---:|---|")
        for path in args.logs:
            f = decode_step_fit(decode_lines(read_log(path)))
            if f is None:
                print(f"| {path.name} | fewer than 3 decode lines decoding alone | | | | |")
                continue
            lo, hi = f["tokens_per_request"]
            print(f"| {path.name} | {f['lines']} | {f['fixed_ms']:.2f} | {f['per_request_us']:.1f} | "
                  f"{f['rms_ms']:.2f} | {lo:.0f}-{hi:.0f} |")
        return
    if args.startup:
        print("| log | first line to ready s | weights s | decode graphs s | scheduler s | tokenizer s "
              "| longest silences: s before the line that ended it |")
        print("|---|---:|---:|---:|---:|---:|---|")
        for path in args.logs:
            r = startup_report(read_log(path))
            e = r["engine"]
            quiet = "; ".join(f"{sec:.0f} s before '{line[:60]}'" for sec, line in r["silences"])
            print(f"| {path.name} | {r['log_to_ready_s']} | {e.get('load_weight', '-')} | "
                  f"{e.get('cuda_graph.decode', '-')} | {e.get('scheduler_e2e', '-')} | {e.get('tokenizer_e2e', '-')} "
                  f"| {quiet} |")
        return
    print("| log | peak running | decode tok/s near the peak | max token usage | prefill phase s | prefill batches | "
          "decode step at the peak ms | prefill batch tok/s, median |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for path in args.logs:
        s = log_stats(read_log(path), args.min_queue)
        step = s["decode_step_ms_at_peak"]
        print(f"| {path.name} | {s['peak_running']} | {s['decode_tok_s_near_peak']} | {s['max_token_usage']} "
              f"| {s['prefill_span_s']} | {s['prefill_batches']} | {'-' if step is None else f'{step:.1f}'} "
              f"| {'-' if s['prefill_tok_s_median'] is None else round(s['prefill_tok_s_median'])} |")


if __name__ == "__main__":
    main()
