"""Engine-side numbers of a measured run, from an SGLang server log (the `server_*.log` that serve_matrix.py and
serve_and_bench.py keep next to each benchmark), for telling the engine's rate from what the client saw:

    python -m benchmarks.server_log_stats docs/serve/v2lite_h100_in4096/server_*.log.xz   (plain or xz-compressed)

Per log: the peak number of running requests, the decode rate near that peak (the fifth-highest `gen throughput`
line: the top few are short bursts at the end of a run), the largest KV-pool usage, and the measured run's prefill
phase: from the first prefill batch with at least `--min-queue` requests waiting (the throughput workloads send all
their prompts at once; the harness's warm-ups send at most 16) to the last prefill batch, in whole seconds (the
log's resolution). Prints a markdown table."""

from __future__ import annotations

import argparse
import lzma
import re
from datetime import datetime
from pathlib import Path

from benchmarks.serve_and_bench import peak_running_requests

_LINE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)[^\]]*\] (Prefill|Decode) batch")


def _field(line: str, name: str) -> float | None:
    m = re.search(re.escape(name) + r":\s*([\d.]+)", line)
    return float(m.group(1)) if m else None


def decode_lines(text: str) -> list[dict]:
    """The decode batches of a server log, in order -> [{"time", "running", "usage", "rate", "queue",
    "prefill_tokens"}]: the line's time (1 s resolution), `#running-req`, `token usage` (of the pool), `gen throughput
    (token/s)` (tokens generated since the previous decode line over the wall time since it, prefill batches in
    between included; None where the line has none), `#queue-req`, and the `#new-token` of the prefill batches logged
    since the previous decode line (0: the line's time is decoding alone)."""
    out = []
    prefill_tokens = 0
    for line in text.splitlines():
        m = _LINE.match(line)
        if m and m.group(2) == "Prefill":
            prefill_tokens += int(_field(line, "#new-token") or 0)
        elif m:
            out.append({"time": datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S"),
                        "running": int(_field(line, "#running-req") or 0), "usage": _field(line, "token usage") or 0.0,
                        "rate": _field(line, "gen throughput (token/s)"),
                        "queue": int(_field(line, "#queue-req") or 0), "prefill_tokens": prefill_tokens})
            prefill_tokens = 0
    return out


def log_stats(text: str, min_queue: int = 32) -> dict:
    """-> {"peak_running", "decode_tok_s_near_peak", "max_token_usage", "prefill_span_s", "prefill_batches"}."""
    batches = []  # (time, kind, line)
    for line in text.splitlines():
        m = _LINE.match(line)
        if m:
            batches.append((datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S"), m.group(2), line))
    decode_rates = sorted(d["rate"] for d in decode_lines(text) if d["rate"] is not None)
    usage = [u for _, _, line in batches for u in [_field(line, "token usage")] if u is not None]
    prefill = [(t, _field(line, "#queue-req") or 0) for t, kind, line in batches if kind == "Prefill"]
    first = next((i for i, (_, queued) in enumerate(prefill) if queued >= min_queue), None)
    prefills = [t for t, _ in prefill[first:]] if first is not None else []
    return {
        "peak_running": peak_running_requests(text),  # None for a server that never decoded
        "decode_tok_s_near_peak": decode_rates[-min(5, len(decode_rates))] if decode_rates else None,
        "max_token_usage": max(usage, default=None),
        "prefill_span_s": (prefills[-1] - prefills[0]).total_seconds() if prefills else None,
        "prefill_batches": len(prefills),
    }


def read_log(path: Path) -> str:
    """A server log's text, plain or xz-compressed (the logs kept under docs/serve are)."""
    raw = lzma.decompress(path.read_bytes()) if path.suffix == ".xz" else path.read_bytes()
    return raw.decode(errors="replace")


def main(argv: list[str] | None = None):
    ap = argparse.ArgumentParser()
    ap.add_argument("logs", nargs="+", type=Path)
    ap.add_argument("--min-queue", type=int, default=32, help="waiting requests that mark the measured run's start")
    args = ap.parse_args(argv)
    print("| log | peak running | decode tok/s near the peak | max token usage | prefill phase s | prefill batches |")
    print("|---|---:|---:|---:|---:|---:|")
    for path in args.logs:
        s = log_stats(read_log(path), args.min_queue)
        print(f"| {path.name} | {s['peak_running']} | {s['decode_tok_s_near_peak']} | {s['max_token_usage']} "
              f"| {s['prefill_span_s']} | {s['prefill_batches']} |")


if __name__ == "__main__":
    main()
