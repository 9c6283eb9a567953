"""benchmarks/gpu_time.py: the server's forward-time counters read from Prometheus text, sampled over HTTP, and their
growth over a window of wall time."""

import threading
from datetime import datetime, timedelta

import pytest

from harness import gpu_time
from local_http import QuietHandler, local_http_server

# as SGLang's /metrics shows them (multiprocess mode): HELP/TYPE lines, a `_created` sample per label set, two ranks,
# and another counter whose labels also carry a category
EXPOSITION = """# HELP sglang:forward_execution_seconds_total Total time that GPU is busy executing model forward passes.
# TYPE sglang:forward_execution_seconds_total counter
sglang:forward_execution_seconds_total{category="decode",engine_type="unified",model_name="m",tp_rank="0"} 12.5
sglang:forward_execution_seconds_total{category="extend",engine_type="unified",model_name="m",tp_rank="0"} 3.25
sglang:forward_execution_seconds_total{category="decode",engine_type="unified",model_name="m",tp_rank="1"} 1.5
sglang:forward_execution_seconds_created{category="decode",engine_type="unified",model_name="m",tp_rank="0"} 1.7e9
sglang:dp_cooperation_forward_execution_seconds_total{category="decode",num_prefill_ranks="0"} 99.0
sglang:num_running_reqs{engine_type="unified",model_name="m",tp_rank="0"} 448.0
"""


def test_the_counter_is_read_per_category_and_summed_over_ranks():
    assert gpu_time.parse_counters(EXPOSITION) == {"decode": 14.0, "extend": 3.25}
    assert gpu_time.parse_counters("sglang:num_running_reqs{tp_rank=\"0\"} 4.0\n") == {}


def _samples(t0: datetime, seconds: int, decode_per_s: float, extend_per_s: float) -> list[dict]:
    return [{"time": (t0 + timedelta(seconds=t)).isoformat(),
             "seconds": {"decode": decode_per_s * t, "extend": extend_per_s * t}} for t in range(seconds + 1)]


def test_the_window_takes_each_counters_growth_between_its_ends_interpolated_between_samples():
    t0 = datetime(2026, 11, 22, 10, 0, 0)
    samples = _samples(t0, 10, 0.6, 0.25)
    got = gpu_time.window_seconds(samples, t0 + timedelta(seconds=2.5), t0 + timedelta(seconds=6.25))
    assert got == {"decode": pytest.approx(0.6 * 3.75), "extend": pytest.approx(0.25 * 3.75)}
    # the window's ends at sample times exactly, the last sample included
    assert gpu_time.window_seconds(samples, t0, t0 + timedelta(seconds=10))["decode"] == pytest.approx(6.0)
    # a category that appears mid-run counts from zero
    late = [{**s, "seconds": {**s["seconds"], "idle": 0.1}} if i >= 5 else s for i, s in enumerate(samples)]
    assert gpu_time.window_seconds(late, t0 + timedelta(seconds=4), t0 + timedelta(seconds=6))["idle"] == \
        pytest.approx(0.1)
    # samples that do not cover the window: no answer rather than a partial one
    assert gpu_time.window_seconds(samples, t0 - timedelta(seconds=1), t0 + timedelta(seconds=5)) is None
    assert gpu_time.window_seconds(samples, t0, t0 + timedelta(seconds=11)) is None
    assert gpu_time.window_seconds([], t0, t0 + timedelta(seconds=1)) is None


class _Metrics(QuietHandler):
    body = ""
    scrapes = 0

    def do_GET(self):  # noqa: N802 (http.server's name)
        type(self).scrapes += 1
        self.reply("text/plain", self.body.replace("{n}", str(type(self).scrapes)).encode())


@pytest.fixture
def metrics_server():
    with local_http_server(_Metrics) as server:
        yield server


def test_the_sampler_reads_the_counters_over_http_until_stopped(metrics_server):
    _Metrics.scrapes = 0
    _Metrics.body = 'sglang:forward_execution_seconds_total{category="decode",tp_rank="0"} {n}.5\n'
    sampler = gpu_time.GpuTimeSampler(metrics_server.server_port, period=0.02).start()
    while _Metrics.scrapes < 4:
        threading.Event().wait(0.01)
    samples = sampler.stop()
    n = len(samples)
    assert n >= 4 and [s["seconds"]["decode"] for s in samples] == [k + 1.5 for k in range(n)]
    times = [datetime.fromisoformat(s["time"]) for s in samples]
    assert times == sorted(times)
    threading.Event().wait(0.1)
    assert len(sampler.samples) == n  # stopped


def test_a_server_without_the_counter_or_not_listening_leaves_no_samples(metrics_server, capsys):
    _Metrics.body = "sglang:num_running_reqs{tp_rank=\"0\"} 4.0\n"
    _Metrics.scrapes = 0
    sampler = gpu_time.GpuTimeSampler(metrics_server.server_port, period=0.02).start()
    while _Metrics.scrapes < 2:
        threading.Event().wait(0.01)
    assert sampler.stop() == []
    port = metrics_server.server_port
    metrics_server.shutdown()
    metrics_server.server_close()
    sampler = gpu_time.GpuTimeSampler(port, period=0.02).start()
    threading.Event().wait(0.2)
    assert sampler.stop() == []
    assert capsys.readouterr().err.count("GpuTimeSampler") == 1  # the first failure, once
