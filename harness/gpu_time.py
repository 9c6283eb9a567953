"""GPU time per forward category of a running SGLang server, read from its Prometheus counters.

With `--enable-metrics` and SGLANG_ENABLE_METRICS_DEVICE_TIMER=1 (`SERVER_FLAGS`, `SERVER_ENV`), SGLang brackets
every forward pass with CUDA events and adds the elapsed GPU seconds to
`sglang:forward_execution_seconds_total{category=...}` (decode, extend, target_verify, idle, ...). Sampling that
counter while a benchmark runs (`GpuTimeSampler`) and taking its growth over a window of wall time
(`window_seconds`) tells how much of the window the GPU spent in decode forwards (`DECODE_CATEGORIES`), in prefill
forwards (`PREFILL_CATEGORIES`), and outside every forward (scheduling, the frontend, gaps between launches).

An interval starts when the scheduler launches a forward: where the GPU is still busy with the previous one, the
start event waits for it, so the intervals do not overlap; a forward whose kernels the CPU launches more slowly than
the GPU runs them counts those gaps as its own.
"""

from __future__ import annotations

import re
import sys
import threading
import urllib.request
from datetime import datetime

# The forward categories of one decode step, and of prefill. With speculative decoding (MTP / EAGLE) a step is a
# draft pass, the target's verify pass and the draft's extend pass, and no forward is labelled "decode"; SGLang 0.5.17
# names the categories after the forward mode or the graph runner (ForwardMode.name.lower(), "eagle_draft", ...).
DECODE_CATEGORIES = ("decode", "target_verify", "eagle_draft", "eagle_draft_extend", "draft_extend", "draft_extend_v2")
PREFILL_CATEGORIES = ("extend", "mixed", "split_prefill")

SERVER_FLAGS = ["--enable-metrics"]
SERVER_ENV = {"SGLANG_ENABLE_METRICS_DEVICE_TIMER": "1"}
COUNTER = "sglang:forward_execution_seconds_total"
_SAMPLE = re.compile(r"^" + re.escape(COUNTER) + r"\{([^}]*)\}\s+(\S+)\s*$", re.M)
_CATEGORY = re.compile(r'(?:^|,)category="([^"]*)"')


def parse_counters(text: str) -> dict[str, float]:
    """Prometheus text exposition -> {category: GPU seconds so far}, summed over the counter's other labels
    (engine, rank)."""
    out: dict[str, float] = {}
    for labels, value in _SAMPLE.findall(text):
        category = _CATEGORY.search(labels)
        if category:
            out[category.group(1)] = out.get(category.group(1), 0.0) + float(value)
    return out


def read_counters(url: str, timeout: float = 5) -> dict[str, float]:
    """One scrape of a server's /metrics (`url`) -> `parse_counters`; raises OSError where it fails."""
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return parse_counters(resp.read().decode("utf-8", "replace"))


def server_seconds(port: int, host: str = "127.0.0.1") -> dict[str, float]:
    """`read_counters` of the server on `port`, {} where its /metrics does not answer."""
    try:
        return read_counters(f"http://{host}:{port}/metrics", timeout=10)
    except OSError:
        return {}


class GpuTimeSampler:
    """Reads the server's /metrics every `period` seconds in a thread, from start() to stop() -> the samples
    [{"time": ISO local time, "seconds": {category: GPU s}}] (local time, as the server's log lines). A scrape that
    fails is skipped; the first failure is reported on stderr, and a server without the device timer (no counter in
    its metrics) leaves no samples."""

    def __init__(self, port: int, period: float = 1.0, host: str = "127.0.0.1"):
        self.url, self.period = f"http://{host}:{port}/metrics", period
        self.samples: list[dict] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._reported = False

    def start(self) -> "GpuTimeSampler":
        self._thread.start()
        return self

    def stop(self) -> list[dict]:
        self._stop.set()
        self._thread.join(timeout=10 * self.period + 5)
        return self.samples

    def _run(self):
        while not self._stop.is_set():
            try:
                seconds = read_counters(self.url)
                if seconds:
                    self.samples.append({"time": datetime.now().isoformat(), "seconds": seconds})
            except OSError as e:  # connection refused, timeout, HTTP error
                if not self._reported:
                    print(f"GpuTimeSampler: {self.url}: {e!r} (skipping failed scrapes)", file=sys.stderr)
                    self._reported = True
            self._stop.wait(self.period)


def window_seconds(samples: list[dict], start: datetime, end: datetime) -> dict[str, float] | None:
    """GPU seconds per category spent between the wall times `start` and `end`: each category's counter,
    interpolated linearly between the samples around each end, at `end` minus at `start`. None when the samples do
    not cover [start, end]."""
    points = [(datetime.fromisoformat(s["time"]), s["seconds"]) for s in samples]
    if not points or points[0][0] > start or points[-1][0] < end or end <= start:
        return None
    categories = {c for _, seconds in points for c in seconds}
    return {c: _at(points, end, c) - _at(points, start, c) for c in sorted(categories)}


def _at(points: list[tuple[datetime, dict]], t: datetime, category: str) -> float:
    for (t0, s0), (t1, s1) in zip(points, points[1:]):
        if t0 <= t <= t1:
            v0, v1 = s0.get(category, 0.0), s1.get(category, 0.0)
            span = (t1 - t0).total_seconds()
            return v0 if span == 0 else v0 + (v1 - v0) * (t - t0).total_seconds() / span
    return points[-1][1].get(category, 0.0)  # t is the last sample's time
