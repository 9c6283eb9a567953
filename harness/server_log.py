"""What the benchmarks read from an SGLang server's log (plain or xz-compressed, as kept under results/serve): its
batches, its pool size, its peak decode batch. Under DP attention every rank logs its own batches, tagged `DPn`."""

from __future__ import annotations

import lzma
import re
import statistics
from datetime import datetime
from pathlib import Path

BATCH_LINE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)([^\]]*)\] (Prefill|Decode) batch")


def read_log(path: Path) -> str:
    """A server log's text, plain or xz-compressed (the logs kept under results/serve are)."""
    raw = lzma.decompress(path.read_bytes()) if path.suffix == ".xz" else path.read_bytes()
    return raw.decode(errors="replace")


def field(line: str, name: str) -> float | None:
    m = re.search(re.escape(name) + r":\s*([\d.]+)", line)
    return float(m.group(1)) if m else None


def decode_lines(text: str) -> list[dict]:
    """The decode batches of a server log, in order -> [{"time", "rank", "running", "tokens", "usage", "rate", "queue",
    "prefill_tokens", "accept"}]: the line's time (1 s resolution), the logging rank's DP tag ("DP1"; "" without DP
    attention), `#running-req`, `#token` (tokens cached), `token usage` (of the pool), `gen throughput (token/s)`
    (tokens generated since the previous decode line over the wall time since it, prefill batches in between
    included; None where the line has none), `#queue-req`, the `#new-token` of the prefill batches the same rank
    logged since its previous decode line (0: the line's time is decoding alone), and `accept len` (speculative
    decoding: tokens a request gained per verify cycle over the line's interval; 1.0 without a draft, where a step
    gains one)."""
    out = []
    prefill_tokens: dict[str, int] = {}  # per rank: each rank prefills and decodes its own requests
    for line in text.splitlines():
        m = BATCH_LINE.match(line)
        if not m:
            continue
        rank = next((tag for tag in m.group(2).split() if tag.startswith("DP")), "")
        if m.group(3) == "Prefill":
            prefill_tokens[rank] = prefill_tokens.get(rank, 0) + int(field(line, "#new-token") or 0)
        else:
            out.append({"time": datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S"), "rank": rank,
                        "running": int(field(line, "#running-req") or 0), "tokens": int(field(line, "#token") or 0),
                        "usage": field(line, "token usage") or 0.0,
                        "rate": field(line, "gen throughput (token/s)"),
                        "queue": int(field(line, "#queue-req") or 0), "prefill_tokens": prefill_tokens.pop(rank, 0),
                        "accept": field(line, "accept len") or 1.0})
    return out


def pool_tokens(server_log: str) -> int | None:
    """The tokens the server's KV pools hold, from its log: one pool's `max_total_num_tokens=` (the last such line),
    times the DP attention ranks (`dp_size` with `enable_dp_attention=True` in the logged server args), each of which
    holds a pool of its own; TP ranks without DP attention hold the same tokens, so they count once."""
    m = re.findall(r"max_total_num_tokens=(\d+)", server_log)
    if not m:
        return None
    dp = re.search(r"\bdp_size=(\d+)", server_log)
    ranks = int(dp.group(1)) if dp and "enable_dp_attention=True" in server_log else 1
    return int(m[-1]) * ranks


def peak_running_requests(server_log: str) -> int | None:
    """The largest `#running-req` of any decode batch in a server log (per rank): shows whether the pool bound the
    batch (the run admitted fewer requests than it was sent)."""
    m = re.findall(r"Decode batch[^\n]*?#running-req: (\d+)", server_log)
    return max(map(int, m)) if m else None


def prefill_intake(text: str, min_queue: int = 0) -> dict:
    """The prefill batches of a log (or of the slice a run wrote), from the first one with at least `min_queue`
    requests waiting (`#queue-req`) -> {"prefill_batches", "prefill_requests", "prefill_span_s",
    "prefill_tok_s_median"}: how many, the requests they admitted (`#new-seq`), the seconds from the first to the last
    (1 s resolution; None without one) and the median of their `input throughput` (SGLang: a batch's new tokens over
    the time since the previous prefill batch's line; the prefill forward's own rate while prefills run back to back,
    as they do while the pool admits the waiting requests, decode steps included once they interleave). With all of
    a workload's requests sent at once, the span is how long the server took to take them in, and a TTFT near it
    says the intake, not the engine, set the TTFT."""
    times, requests, rates = [], 0, []
    for line in text.splitlines():
        m = BATCH_LINE.match(line)
        if m and m.group(3) == "Prefill" and (times or (field(line, "#queue-req") or 0) >= min_queue):
            times.append(datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S"))
            requests += int(field(line, "#new-seq") or 0)
            rate = field(line, "input throughput (token/s)")
            if rate is not None:
                rates.append(rate)
    return {"prefill_batches": len(times), "prefill_requests": requests,
            "prefill_span_s": (times[-1] - times[0]).total_seconds() if times else None,
            "prefill_tok_s_median": statistics.median(rates) if rates else None}


def engine_span(text: str, min_queue: int = 0) -> float | None:
    """Seconds from the first prefill batch with at least `min_queue` requests waiting (`#queue-req`) to the last
    decode batch after it (1 s resolution; None without either): how long the engine worked on the run whose log
    slice `text` is. bench_serving's duration also holds the streaming of every token to its one client process,
    which in a burst of 1 500 streamed requests outlasts the engine's work (docs/BENCHMARKS.md)."""
    start = end = None
    for line in text.splitlines():
        m = BATCH_LINE.match(line)
        if not m:
            continue
        if start is None:
            if m.group(3) == "Prefill" and (field(line, "#queue-req") or 0) >= min_queue:
                start = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")
        elif m.group(3) == "Decode":
            end = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")
    return (end - start).total_seconds() if start and end else None


_STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)[^\]]*\] (.*)")
_ENGINE_TIMINGS = re.compile(r"Engine startup timings \(s\): (.*)")


def startup_report(text: str, gaps: int = 4) -> dict:
    """A server log's start -> {"log_to_ready_s": first log line to "fired up" (None if it never was; Python's
    imports before the first line are not in the log), "engine": SGLang's "Engine startup timings" (seconds by name,
    cuda_graph's parts as "cuda_graph.decode" etc.), "silences": the `gaps` longest times between two consecutive log
    lines before ready, longest first, as (seconds, the line that ended it, cut to 120 characters)}."""
    stamped = [(datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S"), m.group(2))
               for m in map(_STAMP.match, text.splitlines()) if m]
    ready = next((i for i, (_, msg) in enumerate(stamped) if "fired up" in msg), None)
    start = stamped[: (ready + 1) if ready is not None else len(stamped)]
    engine = {}
    for _, msg in start:
        m = _ENGINE_TIMINGS.search(msg)
        if m:
            flat = re.sub(r"(\w+)=\{([^}]*)\}", lambda g: ", ".join(f"{g.group(1)}.{kv.strip()}"
                                                                   for kv in g.group(2).split(",")), m.group(1))
            engine = {k.strip(): float(v) for k, v in (kv.split("=") for kv in flat.split(","))}
    silences = sorted((((b[0] - a[0]).total_seconds(), b[1][:120]) for a, b in zip(start, start[1:])),
                      key=lambda g: -g[0])[:gaps]
    return {"log_to_ready_s": (stamped[ready][0] - stamped[0][0]).total_seconds() if ready is not None else None,
            "engine": engine, "silences": silences}
