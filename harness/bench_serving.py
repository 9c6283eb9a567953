"""`python -m sglang.bench_serving` run against a server, and its printed summary read back: what the serving
benchmarks (benchmarks/serve_*.py) share."""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

# The context length of servers that take the 32k random-ids workloads: bench_serving's random-ids prompts are sent
# as text and the server's re-tokenization makes them ~11 % longer (32 768 ids -> 36 300-36 500 tokens, 4 096 ->
# 4 288-4 672; a context of 33 856 rejects every 32k request while bench_serving counts them as successes)
CONTEXT_LENGTH = 40960
METRICS = {
    "total_tok_s": r"Total token throughput \(tok/s\):\s+([\d.]+)",
    "output_tok_s": r"Output token throughput \(tok/s\):\s+([\d.]+)",
    "median_tpot_ms": r"Median TPOT \(ms\):\s+([\d.]+)",
    "median_itl_ms": r"Median ITL \(ms\):\s+([\d.]+)",
    "median_ttft_ms": r"Median TTFT \(ms\):\s+([\d.]+)",
    "duration_s": r"Benchmark duration \(s\):\s+([\d.]+)",
    "completed": r"Successful requests:\s+(\d+)",
    "output_tokens": r"Total generated tokens:\s+(\d+)",
    "retokenized_output_tokens": r"Total generated tokens \(retokenized\):\s+(\d+)",
    "accept_length": r"Accept length:\s+([\d.]+)",  # speculative decoding only: tokens a request gains per step
}


def bench_serving(port: int, model: str, input_len: int, output_len: int, num_prompts: int, timeout: float,
                  seed: int = 1, max_concurrency: int | None = None, details: Path | None = None,
                  stream: bool = True, range_ratio: float = 1.0) -> tuple[dict, str]:
    """`python -m sglang.bench_serving` (random-ids) against the server -> (METRICS, raw output). Lengths are drawn
    uniformly in [range_ratio x len, len] (1.0: every request the same).
    stream=False: `--disable-stream` (whole responses; no per-token client work, no TTFT / TPOT).
    With `details` (a JSONL path bench_serving appends to), the metrics also carry the per-request TTFTs (s) and
    input lengths, in the order bench_serving lists them: what a median hides (a few slow first requests)."""
    cmd = [sys.executable, "-m", "sglang.bench_serving", "--backend", "sglang", "--port", str(port),
           "--dataset-name", "random-ids", "--random-input-len", str(input_len), "--random-output-len",
           str(output_len), "--random-range-ratio", str(range_ratio), "--tokenizer", model,
           "--num-prompts", str(num_prompts), "--seed", str(seed)]
    if max_concurrency:
        cmd += ["--max-concurrency", str(max_concurrency)]
    if not stream:
        cmd += ["--disable-stream"]
    if details:
        details.unlink(missing_ok=True)
        cmd += ["--output-file", str(details), "--output-details"]
    b = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    metrics = parse_metrics(b.stdout)
    if metrics.get("retokenized_output_tokens") == 0:  # bench_serving counts rejected requests as successes
        raise RuntimeError(f"bench_serving in {input_len} / out {output_len}: no output text streamed back (the "
                           "server rejected the requests; its log says why, e.g. input longer than the context)")
    if details and details.exists():
        metrics.update(request_details(details.read_text()))
    return metrics, b.stdout + b.stderr


def request_details(jsonl: str) -> dict:
    """Per-request TTFTs (s) and input lengths from bench_serving's --output-details line (the last one)."""
    last = json.loads(jsonl.strip().splitlines()[-1])
    return {"ttfts_s": [round(t, 4) for t in last.get("ttfts", [])], "input_lens": last.get("input_lens", [])}


def ttft_outliers(metrics: dict, factor: float = 5.0) -> list[tuple[int, int, float]]:
    """(request index, input length, TTFT s) of the requests whose TTFT exceeds `factor` x the median TTFT."""
    ttfts = metrics.get("ttfts_s") or []
    if not ttfts:
        return []
    median = statistics.median(ttfts)
    lens = metrics.get("input_lens") or [None] * len(ttfts)
    return [(i, n, t) for i, (t, n) in enumerate(zip(ttfts, lens)) if t > factor * median]


def parse_metrics(text: str, patterns: dict[str, str] = METRICS) -> dict:
    """`patterns` (name -> regex with one number group; default METRICS) from bench_serving's printed summary (None
    where a line is missing)."""
    found = {key: re.search(pat, text) for key, pat in patterns.items()}
    return {key: float(m.group(1)) if m else None for key, m in found.items()}
