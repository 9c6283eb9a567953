"""The throughput-matrix report of benchmarks/serve_matrix.py, from recorded results (no server)."""

import json

import pytest

from benchmarks import serve_matrix as sm
from helpers import ink_share


def _metrics(total, tpot):
    return {"total_tok_s": total, "output_tok_s": total / 9, "median_tpot_ms": tpot, "median_itl_ms": tpot / 2,
            "median_ttft_ms": 1000.0, "duration_s": 10.0, "completed": 8.0}


def _results(model="configs/models/deepseek-v2-lite-shape"):
    return {model: {
        "flashmla": {"pool_tokens": 1000, "workloads": {"in4096-out512": _metrics(100.0, 40.0),
                                                        "in32768-out1024": _metrics(50.0, 80.0),
                                                        "latency-c1": _metrics(10.0, 5.0)}},
        "snapmla": {"pool_tokens": 1790, "workloads": {"in4096-out512": _metrics(170.0, 50.0),
                                                       "in32768-out1024": _metrics(60.0, 70.0),
                                                       "latency-c1": _metrics(9.0, 6.0)}},
        "triton": {"error": "RuntimeError('server exited with 1')", "workloads": {}, "pool_tokens": None}}}


def test_table_ratios_and_targets():
    text = sm.table(_results())
    rows = {(r.split("|")[2].strip(), r.split("|")[3].strip()): r for r in text.splitlines()[2:]}
    assert "1.70x" in rows[("in4096-out512", "snapmla")] and "met (>= 1.6x)" in rows[("in4096-out512", "snapmla")]
    assert "1.20x" in rows[("in32768-out1024", "snapmla")] and "not met (>= 1.8x)" in rows[("in32768-out1024",
                                                                                         "snapmla")]
    assert "0.90x" in rows[("latency-c1", "snapmla")] and "not met (>= 1.0x)" in rows[("latency-c1", "snapmla")]
    assert "1.00x" in rows[("in4096-out512", "flashmla")]  # the reference; no target for it
    assert "met" not in rows[("in4096-out512", "flashmla")]
    assert "error: RuntimeError" in rows[("-", "triton")]


def test_merge_tabulates_and_plots(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(_results()))
    b.write_text(json.dumps(_results("configs/models/deepseek-v3-shape")))
    sm.main(["--merge", str(a), str(b), "--out", str(tmp_path / "out")])
    merged = json.loads((tmp_path / "out" / "serve_matrix.json").read_text())
    assert set(merged) == {"configs/models/deepseek-v2-lite-shape", "configs/models/deepseek-v3-shape"}
    for png in ("serve_matrix_throughput.png", "serve_matrix_tpot.png"):
        assert ink_share(tmp_path / "out" / png) > 0.05


def test_merge_keeps_the_workloads_of_every_call_for_one_backend():
    model = "configs/models/deepseek-v2-lite-shape"
    first = {model: {"snapmla": {"pool_tokens": 1790, "workloads": {"in4096-out512": _metrics(170.0, 50.0),
                                                                    "latency-c1": _metrics(9.0, 6.0)}}}}
    second = {model: {"snapmla": {"pool_tokens": 1790, "workloads": {"in32768-out1024": _metrics(60.0, 70.0),
                                                                     "latency-c1": _metrics(11.0, 5.0)}}}}
    from harness.results import merge_into

    merged = merge_into(merge_into({}, first), second)
    workloads = merged[model]["snapmla"]["workloads"]
    assert set(workloads) == {"in4096-out512", "latency-c1", "in32768-out1024"}
    assert workloads["latency-c1"]["total_tok_s"] == 11.0  # the later call's run of a workload wins
    assert first[model]["snapmla"]["workloads"].keys() == {"in4096-out512", "latency-c1"}  # inputs untouched


def test_server_log_parsers_read_pool_and_peak_batch():
    """The benchmarks read the pool size (last rank's line) and the largest decode batch from a server log; a log
    without decode batches gives None rather than 0 (a server that never decoded must not look capacity-bound)."""
    from harness import server_log as sb

    log = "\n".join([
        "[DP0 TP0] max_total_num_tokens=885120, chunked_prefill_size=4096",
        "[DP1 TP1] max_total_num_tokens=885121, chunked_prefill_size=4096",
        "[DP0 TP0] Prefill batch, #new-seq: 2, #new-token: 4096, #running-req: 400, #queue-req: 3",  # not a batch
        "[DP0 TP0] Decode batch, #running-req: 190, #token: 868672, token usage: 0.98, cuda graph: True",
        "[DP1 TP1] Decode batch, #running-req: 12, #token: 1000, token usage: 0.01, cuda graph: True",
    ])
    assert sb.pool_tokens(log) == 885121
    assert sb.peak_running_requests(log) == 190
    assert sb.peak_running_requests("no batches yet") is None
    assert sb.pool_tokens("") is None
    # under DP attention every rank holds its own pool (only DP0 logs its size): the server holds dp_size of them
    dp_log = ("[DP0 TP0] server_args=ServerArgs(tp_size=2, dp_size=2, enable_dp_attention=True, port=30000)\n"
              "[DP0 TP0] max_total_num_tokens=390464, chunked_prefill_size=4096")
    assert sb.pool_tokens(dp_log) == 2 * 390464
    assert sb.pool_tokens(dp_log.replace("enable_dp_attention=True", "enable_dp_attention=False")) == 390464


def test_request_details_and_ttft_outliers_are_listed():
    """Per-request TTFTs from bench_serving's --output-details line; requests over 5x the median TTFT are listed under
    the table (seen: two of eight concurrency-1 requests at 1.3-1.75 s against a 0.1 s median)."""
    from harness import bench_serving as sb

    line = json.dumps({"completed": 8, "ttfts": [1.5, 0.09, 0.1, 0.095, 1.2, 0.1, 0.11, 0.1],
                       "input_lens": [4672, 4672, 4352, 4544, 4480, 4608, 4480, 4544], "itls": [[0.003]] * 8})
    details = sb.request_details("{}\n" + line + "\n")
    assert details["input_lens"][0] == 4672 and details["ttfts_s"][4] == 1.2
    assert sb.ttft_outliers(details) == [(0, 4672, 1.5), (4, 4480, 1.2)]
    assert sb.ttft_outliers({}) == [] and sb.ttft_outliers({"ttfts_s": [0.1] * 8}) == []
    results = _results()
    results["configs/models/deepseek-v2-lite-shape"]["snapmla"]["workloads"]["latency-c1"].update(details)
    rows = [r for r in sm.table(results).splitlines() if "TTFT > 5x median" in r]
    assert len(rows) == 1 and "latency-c1 | snapmla" in rows[0] and "request 0 (4672 tokens) 1.50 s" in rows[0]


def test_compiles_during_a_run_and_repeats_are_tabulated(tmp_path):
    """Kernels whose Triton cache entries appear while a workload runs are listed under the table, and a workload
    run twice on one server is a second row (NAME#2) with its own ratio: a first-use cost shows as their difference."""
    cache = tmp_path / "triton"
    (cache / "aaa").mkdir(parents=True)
    (cache / "aaa" / "fetch_dequant_kernel.json").write_text("{}")
    (cache / "aaa" / "__grp__fetch_dequant_kernel.json").write_text("{}")
    before = sm.triton_cache_entries(cache)
    assert before == {"aaa/fetch_dequant_kernel"}
    (cache / "bbb").mkdir()
    (cache / "bbb" / "merge_state_kernel.json").write_text("{}")
    (cache / "ccc").mkdir()
    (cache / "ccc" / "fetch_dequant_kernel.json").write_text("{}")  # a second specialization of the same kernel
    assert sm.compiled_kernels(before, sm.triton_cache_entries(cache)) == ["fetch_dequant_kernel",
                                                                            "merge_state_kernel"]
    assert sm.triton_cache_entries(tmp_path / "missing") == set()
    assert sm.run_key("latency-c1", {}) == "latency-c1"
    assert sm.run_key("latency-c1", {"latency-c1": {}, "latency-c1#2": {}}) == "latency-c1#3"

    results = _results()
    snap = results["configs/models/deepseek-v2-lite-shape"]["snapmla"]["workloads"]
    snap["latency-c1"]["jit_compiled"] = ["merge_state_kernel"]
    snap["latency-c1#2"] = {**_metrics(10.5, 5.0), "jit_compiled": []}
    rows = sm.table(results).splitlines()
    repeat = [r for r in rows if "| latency-c1#2 | snapmla |" in r]
    assert len(repeat) == 1 and "1.05x" in repeat[0] and "met (>= 1.0x)" in repeat[0]
    compiled = [r for r in rows if "JIT-compiled during the run" in r]
    assert len(compiled) == 1 and "latency-c1 | snapmla" in compiled[0] and "merge_state_kernel" in compiled[0]
    assert rows.index(repeat[0]) > min(i for i, r in enumerate(rows) if "| latency-c1 | snapmla |" in r)


def test_shape_warmup_sends_the_workloads_first_prompts_with_few_outputs():
    """The unmeasured run before a workload uses its seed, input length and concurrency (same prefill shapes), at most
    16 prompts and 8 output tokens."""
    for name, w in sm.WORKLOADS.items():
        warm = sm.shape_warmup(w)
        assert warm["input_len"] == w["input_len"] and warm.get("max_concurrency") == w.get("max_concurrency")
        assert warm["num_prompts"] == min(16, w["num_prompts"]) and warm["output_len"] == 8
    assert sm.shape_warmup(sm.WORKLOADS["latency-c1"])["num_prompts"] == 8


def test_rejected_requests_are_not_counted_as_a_result():
    """bench_serving reports requests the server rejected (input over the context length) as successes with 0
    TTFT; the number of output tokens it re-tokenized is 0 then, which the harness reads and refuses."""
    from harness import bench_serving as sb

    text = ("Successful requests:                     64\nTotal token throughput (tok/s):          295130.24\n"
            "Total generated tokens (retokenized):    0\nMedian TTFT (ms):                        0.00\n")
    assert sb.parse_metrics(text)["retokenized_output_tokens"] == 0
    assert sb.parse_metrics(text.replace("    0\nMedian", "    65536\nMedian"))["retokenized_output_tokens"] == 65536
    assert sm.CONTEXT_LENGTH >= int(32768 * 1.12) + 1024  # re-tokenized 32k prompts fit


@pytest.mark.filterwarnings("ignore:No artists with labels")
def test_nostream_workload_disables_streaming_and_stays_off_the_plots(monkeypatch, tmp_path):
    """The -nostream workload passes --disable-stream to bench_serving (streamed workloads do not) and is left out
    of the context-length plots, where it would sit on top of its streamed twin."""
    import subprocess

    from harness import bench_serving as sb

    sent = []

    def fake_run(cmd, **kwargs):
        sent.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, "Total generated tokens (retokenized):    5\n", "")

    monkeypatch.setattr(sb.subprocess, "run", fake_run)
    for name in ("in1024-out1024", "in1024-out1024-nostream"):
        sb.bench_serving(31000, "m", timeout=1.0, **sm.WORKLOADS[name])
    assert "--disable-stream" not in sent[0] and "--disable-stream" in sent[1]
    assert "--random-input-len" in sent[1] and sent[1][sent[1].index("--num-prompts") + 1] == "512"
    results = _results()
    results["configs/models/deepseek-v2-lite-shape"]["snapmla"]["workloads"]["in1024-out1024-nostream"] = \
        _metrics(1e9, 1.0)  # would dominate the throughput axis if it were drawn
    drawn = []
    monkeypatch.setattr("matplotlib.axes.Axes.plot", lambda self, *a, **k: drawn.append(a) or [])
    sm.plot(results, tmp_path)
    assert drawn and all(1e9 not in ys for _, ys in drawn)
    row = next(r for r in sm.table(results).splitlines() if "in1024-out1024-nostream | snapmla" in r)
    assert row.split("|")[6:9] == [" - ", " - ", " - "]  # TPOT, ITL, TTFT: not measured without streaming


def test_same_prefill_reference_column():
    """With a flashmla-mhaprefill run (FlashMLA with snapmla's prefill routing), each row also gets its ratio to it;
    rows of a workload without that run show '-' there."""
    results = _results()
    model = next(iter(results))
    results[model]["flashmla-mhaprefill"] = {"pool_tokens": 1000,
                                             "workloads": {"in4096-out512": _metrics(125.0, 42.0)}}
    text = sm.table(results)
    header = [c.strip() for c in text.splitlines()[0].split("|")]
    col = header.index("vs flashmla, MHA prefill")
    rows = {(r.split("|")[2].strip(), r.split("|")[3].strip()): [c.strip() for c in r.split("|")]
            for r in text.splitlines()[2:]}
    assert rows[("in4096-out512", "snapmla")][col] == "1.36x"  # 170 / 125
    assert rows[("in4096-out512", "flashmla")][col] == "0.80x"
    assert rows[("in4096-out512", "flashmla-mhaprefill")][col] == "1.00x"
    assert rows[("in32768-out1024", "snapmla")][col] == "-"
    assert all(len(r) == len(header) for r in rows.values())  # every row has every column


def test_mhaprefill_run_sets_the_threshold_env(tmp_path, monkeypatch):
    """The flashmla-mhaprefill run is the flashmla command line with SGLANG_CHUNKED_PREFIX_CACHE_THRESHOLD=1 in the
    server's environment (and in the recorded command)."""
    from harness import server as sb

    seen = {}

    class FakePopen:
        pid = 12345

        def __init__(self, cmd, env=None, **kw):
            seen["cmd"], seen["env"] = cmd, env

    monkeypatch.setattr(sb.subprocess, "Popen", FakePopen)
    assert sb.RUNS["flashmla-mhaprefill"] == sb.RUNS["flashmla"]
    proc, log = sb.start_server("m", 1, sb.RUNS["flashmla-mhaprefill"], tmp_path / "log",
                                env=sb.RUN_ENV["flashmla-mhaprefill"])
    log.close()
    sb._live_servers.discard(proc.pid)
    assert seen["env"]["SGLANG_CHUNKED_PREFIX_CACHE_THRESHOLD"] == "1"
    assert "PATH" in seen["env"]  # added to the inherited environment, not replacing it
    assert proc.cmd.startswith("SGLANG_CHUNKED_PREFIX_CACHE_THRESHOLD=1 ")
    proc, log = sb.start_server("m", 1, sb.RUNS["flashmla"], tmp_path / "log2")
    log.close()
    sb._live_servers.discard(proc.pid)
    assert seen["env"] is None


def test_disable_stream_and_range_ratio_reach_the_measured_bench_only(monkeypatch, tmp_path, capsys):
    """serve_and_bench.py --disable-stream: the measured bench_serving call runs without streaming (so that the
    frontend does not set the duration); the warm-up call keeps its default; without the flag both stream.
    --range-ratio reaches the measured call (the burst's lengths), the warm-up keeps fixed lengths;
    --warmup-output-len shortens the warm-up's outputs only; --cuda-graph-max-bs 0 passes no graph flag (the
    server's default)."""
    import argparse
    import types

    from benchmarks import serve_and_bench as sb

    calls = []

    def fake_bench(port, model, input_len, output_len, num_prompts, timeout, seed=1, stream=True, range_ratio=1.0,
                   **kw):
        calls.append((num_prompts, output_len, stream, range_ratio))
        return {"total_tok_s": 1.0}, "text"

    flags = []

    def fake_start(model, port, server_flags, log_path, **kw):
        flags.append(server_flags)
        return types.SimpleNamespace(cmd="c", pid=1), open(log_path, "w")

    monkeypatch.setattr(sb, "start_server", fake_start)
    monkeypatch.setattr(sb, "wait_healthy", lambda *a: None)
    monkeypatch.setattr(sb, "check_endpoints", lambda *a: {})
    monkeypatch.setattr(sb, "stop_server", lambda proc, log: log.close())
    monkeypatch.setattr(sb, "bench_serving", fake_bench)
    for flag in (True, False):
        calls.clear(), flags.clear()
        args = argparse.Namespace(model="m", cuda_graph_max_bs=8 if flag else 0, extra=[], greedy_repeat=False,
                                  num_prompts=64, warmup_prompts=4, input_len=16, output_len=8, bench_timeout=1.0,
                                  startup_timeout=1.0,
                                  disable_stream=flag, launcher="launch_server", range_ratio=0.5,
                                  warmup_output_len=None if flag else 2)
        res = sb.run_one("snapmla", args, tmp_path, 30000)
        assert "error" not in res, res
        assert calls == [(4, 8 if flag else 2, True, 1.0), (64, 8, not flag, 0.5)]
        assert "serve_and_bench: snapmla: answered in" in capsys.readouterr().out  # before its bench, every run
        graph_flags = [f for f in flags[0] if f.startswith("--cuda-graph")]
        assert graph_flags == (["--cuda-graph-max-bs"] if flag else []), flags
        assert not flag or flags[0][flags[0].index("--cuda-graph-max-bs") + 1] == "8"


def test_serve_and_bench_table_divides_by_the_bf16_run_of_the_same_call():
    """The burst table's ratios: output rate, median TTFT and pool against the flashmla run in the same results,
    '-' where that run is missing or failed."""
    from benchmarks import serve_and_bench as sb

    runs = [{"run": "snapmla", "total_tok_s": 30.0, "output_tok_s": 12.0, "median_ttft_ms": 500.0,
             "pool_tokens": 1790, "peak_running_req": 9, "engine_output_tok_s": 26},
            {"run": "flashmla", "total_tok_s": 20.0, "output_tok_s": 10.0, "median_ttft_ms": 1000.0,
             "pool_tokens": 1000, "peak_running_req": 5, "engine_output_tok_s": 20}]
    row = sb.table(runs).splitlines()[2]
    assert row.endswith("| 9 | 1.20x | 0.50x | 1.79x | 26 | 1.30x | - | - |"), row
    alone = sb.table([runs[0], {"run": "flashmla", "error": "x"}]).splitlines()[2]
    assert alone.endswith("| - | - | - | 26 | - | - | - |"), alone


def _batch_line(t: str, kind: str, queue: int) -> str:
    return f"[2026-01-01 00:{t}] {kind} batch, #running-req: 4, #queue-req: {queue}, cuda graph: True\n"


def test_engine_span_runs_from_the_first_admitting_prefill_to_the_last_decode():
    """harness.server_log.engine_span: first prefill batch with >= min_queue waiting -> last decode batch after it;
    decode lines before that prefill (a warm-up) and other lines do not count; None without a prefill or a decode."""
    from harness.server_log import engine_span

    log = "".join([_batch_line("00:01", "Decode", 0), _batch_line("00:05", "Prefill", 2),
                   _batch_line("00:07", "Prefill", 300), _batch_line("00:09", "Decode", 0), "[x] other\n",
                   _batch_line("01:02", "Decode", 0)])
    assert engine_span(log) == 57.0
    assert engine_span(log, min_queue=100) == 55.0
    assert engine_span(log, min_queue=1000) is None
    assert engine_span(_batch_line("00:05", "Prefill", 2)) is None


def test_the_step_fit_recovers_a_fixed_part_and_a_cost_per_request():
    """benchmarks.server_log_stats.decode_step_fit: steps of 2 ms + 20 µs a request come back exactly from the lines
    decoding alone with >= 32 running; a line after a prefill batch or below 32 running does not count; fewer than
    three lines give None."""
    from benchmarks.server_log_stats import decode_step_fit
    from harness.server_log import decode_lines

    def decode(t, running, step_ms):
        return (f"[2026-01-01 00:00:{t:02d}] Decode batch, #running-req: {running}, #token: {running * 2000}, token "
                f"usage: 0.10, cuda graph: True, gen throughput (token/s): {1000 * running / step_ms:.6f}, "
                "#queue-req: 0\n")

    prefill = "[2026-01-01 00:00:30] Prefill batch, #new-seq: 1, #new-token: 64, #cached-token: 0, token usage: 0.1\n"
    log = "".join([decode(1, 64, 3.28), decode(2, 128, 4.56), decode(3, 256, 7.12), prefill, decode(31, 200, 99.0),
                   decode(32, 8, 50.0), decode(33, 192, 5.84)])
    f = decode_step_fit(decode_lines(log))
    assert f["lines"] == 4 and abs(f["fixed_ms"] - 2.0) < 1e-6 and abs(f["per_request_us"] - 20.0) < 1e-6
    assert f["rms_ms"] < 1e-6 and f["tokens_per_request"] == (2000, 2000)
    assert decode_step_fit(decode_lines(decode(1, 64, 3.28) + decode(2, 128, 4.56))) is None


def test_serve_and_bench_engine_rate_reads_only_the_measured_calls_log_lines(monkeypatch, tmp_path):
    """run_one's engine rate: the output tokens bench_serving reports over the span of the batches the server logged
    during the measured call; the warm-up's batches (logged before it) stay out."""
    import argparse
    import types

    from benchmarks import serve_and_bench as sb

    calls = []

    def fake_bench(port, model, input_len, output_len, num_prompts, timeout, seed=1, **kw):
        calls.append(num_prompts)
        lines = ([_batch_line("00:00", "Prefill", 3), _batch_line("00:02", "Decode", 0)] if len(calls) == 1 else
                 [_batch_line("00:10", "Prefill", 0), _batch_line("00:30", "Decode", 0)])
        with open(tmp_path / "server_snapmla.log", "a") as f:  # as the server process appends to its log
            f.write("".join(lines))
        return {"total_tok_s": 1.0, "output_tokens": 4000.0}, "text"

    monkeypatch.setattr(sb, "start_server", lambda *a, **k: (types.SimpleNamespace(cmd="c", pid=1), open(a[3], "w")))
    monkeypatch.setattr(sb, "wait_healthy", lambda *a: None)
    monkeypatch.setattr(sb, "check_endpoints", lambda *a: {})
    monkeypatch.setattr(sb, "stop_server", lambda proc, log: log.close())
    monkeypatch.setattr(sb, "bench_serving", fake_bench)
    args = argparse.Namespace(model="m", cuda_graph_max_bs=8, extra=[], greedy_repeat=False, num_prompts=64,
                              warmup_prompts=4, input_len=16, output_len=8, bench_timeout=1.0, startup_timeout=1.0,
                              disable_stream=False, launcher="launch_server", range_ratio=0.5, warmup_output_len=None)
    res = sb.run_one("snapmla", args, tmp_path, 30000)
    assert calls == [4, 64] and res["engine_span_s"] == 20.0 and res["engine_output_tok_s"] == 200, res


def test_serve_and_bench_keeps_a_runs_start_up_when_its_bench_is_cut(monkeypatch, tmp_path):
    """main() saves serve_bench.json as each run's row grows: by the time bench_serving starts, the row with the
    start-up time and the endpoint probe is on disk, so a time limit that kills the call during the bench keeps it."""
    import json
    import sys
    import types

    from benchmarks import serve_and_bench as sb

    on_disk = []

    def fake_bench(*a, **kw):  # what a kill here would leave
        on_disk.append(json.loads((tmp_path / "serve_bench.json").read_text()))
        return {"total_tok_s": 1.0, "output_tokens": 8.0}, "text"

    monkeypatch.setattr(sb, "start_server", lambda *a, **k: (types.SimpleNamespace(cmd="c", pid=1), open(a[3], "w")))
    monkeypatch.setattr(sb, "wait_healthy", lambda *a: None)
    monkeypatch.setattr(sb, "check_endpoints", lambda *a: {"generate": "text"})
    monkeypatch.setattr(sb, "stop_server", lambda proc, log: log.close())
    monkeypatch.setattr(sb, "bench_serving", fake_bench)
    monkeypatch.setattr(sb, "kill_servers_on_exit", lambda: None)
    monkeypatch.setattr(sb, "plot", lambda results, path: path)
    monkeypatch.setattr(sys, "argv", ["serve_and_bench", "--out", str(tmp_path), "--runs", "snapmla", "flashmla",
                                      "--num-prompts", "4", "--warmup-prompts", "0"])
    sb.main()
    first, second = on_disk  # at each run's bench
    assert [r["run"] for r in first] == ["snapmla"] and "startup_s" in first[0] and "total_tok_s" not in first[0]
    assert first[0]["endpoints"] == {"generate": "text"}
    assert [r["run"] for r in second] == ["snapmla", "flashmla"] and second[0]["total_tok_s"] == 1.0
    assert "startup_s" in second[1] and "total_tok_s" not in second[1]


def test_launchers_build_the_two_documented_server_commands(monkeypatch):
    """--launcher: `python -m sglang.launch_server ...`, or the sglang CLI's `serve` subcommand (the console script
    where installed, else what that script runs); the flags are the same; an unknown launcher is an error."""
    import subprocess

    from harness import server as sb

    flags = ["--attention-backend", "snapmla"]
    module = sb.server_command("m", 30000, flags)
    assert module[1:3] == ["-m", "sglang.launch_server"]
    monkeypatch.setattr(sb.shutil, "which", lambda name: None)
    cli = sb.server_command("m", 30000, flags, launcher="sglang-serve")
    assert cli[3] == "serve" and cli[4:] == module[3:]
    res = subprocess.run([*cli[:4], "--help"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and "sglang serve" in res.stdout, res.stdout[-500:] + res.stderr[-1000:]
    monkeypatch.setattr(sb.shutil, "which", lambda name: "/usr/bin/sglang")
    assert sb.server_command("m", 1, flags, launcher="sglang-serve")[:2] == ["/usr/bin/sglang", "serve"]
    with pytest.raises(ValueError, match="launcher"):
        sb.server_command("m", 1, flags, launcher="serve")


def test_a_run_cut_short_keeps_its_finished_workloads(monkeypatch, tmp_path):
    """serve_matrix.json is written after every workload: a run killed by a time limit keeps what it
    measured, with the workloads of earlier runs, and --resume then runs only the rest."""
    import types

    model = "configs/models/deepseek-v2-lite-shape"
    (tmp_path / "serve_matrix.json").write_text(json.dumps(
        {model: {"flashmla": {"pool_tokens": 1000, "workloads": {"latency-c1": _metrics(10.0, 5.0)}}}}))
    ran = []

    def fake_workload(port, model, backend, name, key, out, timeout):
        ran.append(name)
        if name == "in32768-out1024":
            raise SystemExit("killed by the call's limit")  # not an Exception: nothing after it runs
        return _metrics(20.0, 9.0)

    def fake_start(model, port, flags, log_path, **kw):
        log_path.write_text("[TP0] max_total_num_tokens=2088768, chunked_prefill_size=8192\n")
        return types.SimpleNamespace(cmd="c", pid=1), open(log_path, "a")

    monkeypatch.setattr(sm, "start_server", fake_start)
    monkeypatch.setattr(sm, "wait_healthy", lambda *a: None)
    monkeypatch.setattr(sm, "bench_serving", lambda *a, **k: ({}, ""))
    monkeypatch.setattr(sm, "stop_server", lambda proc, log: log.close())
    monkeypatch.setattr(sm, "kill_servers_on_exit", lambda: None)
    monkeypatch.setattr(sm, "run_workload", fake_workload)
    argv = ["--resume", "--backends", "flashmla", "--out", str(tmp_path), "--workloads", "latency-c1", "latency-c8",
            "in32768-out1024"]
    with pytest.raises(SystemExit):
        sm.main(argv)
    assert ran == ["latency-c8", "in32768-out1024"]  # latency-c1 came from the earlier call
    cut = json.loads((tmp_path / "serve_matrix.json").read_text())[model]["flashmla"]
    kept = cut["workloads"]
    assert set(kept) == {"latency-c1", "latency-c8"} and kept["latency-c1"]["total_tok_s"] == 10.0
    assert cut["pool_tokens"] == 2088768  # read once the server is up, not only at its end
    ran.clear()
    monkeypatch.setattr(sm, "run_workload", lambda *a: ran.append(a[3]) or _metrics(30.0, 9.0))
    monkeypatch.setattr(sm, "plot", lambda results, out: [])
    sm.main(argv)
    assert ran == ["in32768-out1024"]
    kept = json.loads((tmp_path / "serve_matrix.json").read_text())[model]["flashmla"]["workloads"]
    assert set(kept) == {"latency-c1", "latency-c8", "in32768-out1024"}


@pytest.mark.parametrize("folder, min_queue, quoted", [
    ("burst_h200_graphs", 100, {"snapmla": ("9 289", "21 083"), "flashmla": ("8 912", "16 331")}),
    ("burst_h200_unstreamed", 100, {"snapmla": ("21 460", "22 299"), "flashmla": ("16 731", "17 569")}),
    ("burst_h200_default_graphs", 100, {"snapmla": ("13 126", "13 483"), "flashmla": ("11 516", "11 713")}),
    ("long_context_h200/with_bf16", 5, {"snapmla": ("2 258", None), "flashmla": ("1 687", None)}),
])
def test_saved_serving_runs_reprint_to_what_the_docs_quote(folder, min_queue, quoted):
    """`serve_and_bench --reprint` over the committed runs gives the output and engine rates docs/BENCHMARKS.md
    quotes (rounded, thin-space thousands as there)."""
    from pathlib import Path

    from benchmarks import serve_and_bench as sb

    root = Path(__file__).resolve().parents[2]
    docs = (root / "docs" / "BENCHMARKS.md").read_text()
    runs = {r["run"]: r for r in sb.reprint(root / "results" / "serve" / folder, min_queue)}
    for run, (output, engine) in quoted.items():
        assert f"{round(runs[run]['output_tok_s']):,}".replace(",", " ") == output and output in docs, (run, output)
        if engine:
            assert f"{runs[run]['engine_output_tok_s']:,}".replace(",", " ") == engine and engine in docs, (run, engine)


def test_serve_and_bench_merges_runs_of_one_workload_from_several_folders(tmp_path, monkeypatch):
    """`serve_and_bench --merge A B --out DIR`: the runs of one workload saved by one process per GPU become one folder
    (results side by side, each run's server log and bench_serving text, plain or kept as .xz, copied, and the plot
    drawn), whose table --reprint prints; another workload or a run in two folders stops with the reason."""
    import lzma
    import sys

    from benchmarks import serve_and_bench as sb

    workload = {"input_len": 1024, "output_len": 1024, "num_prompts": 1500, "cuda_graph_max_bs": 1536}
    batch = "[2026-11-30 02:37:{:02d}] {} batch, #running-req: 9, #queue-req: {}, gen throughput (token/s): 1.0\n"
    log = batch.format(0, "Prefill", 100) + batch.format(20, "Decode", 0)
    for folder, run in (("a", "snapmla"), ("b", "flashmla")):
        d = tmp_path / folder
        d.mkdir()
        (d / "serve_bench.json").write_text(json.dumps([{"run": run, "workload": workload, "output_tokens": 1000.0,
                                                         "output_tok_s": 50.0}]))
        if run == "snapmla":
            (d / f"server_{run}.log.xz").write_bytes(lzma.compress(log.encode()))
        else:
            (d / f"server_{run}.log").write_text(log)
        (d / f"bench_{run}.txt").write_text("bench")
    out = tmp_path / "merged"
    monkeypatch.setattr(sys, "argv", ["sb", "--merge", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(out),
                                      "--min-queue", "100"])
    sb.main()
    assert [r["run"] for r in json.loads((out / "serve_bench.json").read_text())] == ["snapmla", "flashmla"]
    assert {f.name for f in out.iterdir()} == {"serve_bench.json", "server_snapmla.log.xz", "server_flashmla.log",
                                               "bench_snapmla.txt", "bench_flashmla.txt", "serve_bench.png"}
    assert [r["engine_output_tok_s"] for r in sb.reprint(out, 100)] == [50, 50]  # 1 000 tokens over 20 s
    (out / "serve_bench.png").unlink()
    monkeypatch.setattr(sys, "argv", ["sb", "--reprint", str(out), "--min-queue", "100"])
    sb.main()  # --reprint prints the table again and draws the plot
    assert (out / "serve_bench.png").stat().st_size > 0
    with pytest.raises(SystemExit, match="more than one folder"):
        sb.merge_folders([tmp_path / "a", tmp_path / "a"], tmp_path / "twice")
    (tmp_path / "b" / "serve_bench.json").write_text(json.dumps([{"run": "flashmla",
                                                                  "workload": {**workload, "num_prompts": 64}}]))
    with pytest.raises(SystemExit, match="another workload"):
        sb.merge_folders([tmp_path / "a", tmp_path / "b"], tmp_path / "other")


def test_greedy_repeat_generates_both_passes_from_an_empty_radix_cache(monkeypatch):
    """--greedy-repeat compares two passes of the same seeded batch, each after a cache flush (a second pass over a
    warm cache would prefill the prompts' last page over a cached prefix, another computation); a difference in any
    output is reported."""
    from benchmarks import serve_and_bench as sb

    events, cached = [], set()

    def generate(port, ids, new_tokens):
        events.append("hit" if tuple(ids) in cached else "fresh")
        cached.add(tuple(ids))
        return {"output_ids": [len(ids) % 7] * new_tokens}

    def flush(port):
        events.append("flush")
        cached.clear()

    monkeypatch.setattr(sb, "greedy_generate", generate)
    monkeypatch.setattr(sb, "flush_cache", flush)
    res = sb.greedy_repeat(30000, prompts=3, new_tokens=4)
    assert res["identical"] and len(res["outputs"]) == 3
    assert events == ["flush", "fresh", "fresh", "fresh", "flush", "fresh", "fresh", "fresh"]
    outputs = iter([[1], [2], [3], [1], [2], [4]])
    monkeypatch.setattr(sb, "greedy_generate", lambda port, ids, n: {"output_ids": next(outputs)})
    assert not sb.greedy_repeat(30000, prompts=3, new_tokens=1)["identical"]


def test_a_run_with_nan_outputs_says_so_in_its_row_and_its_log(capsys):
    """A run whose endpoint probe returned non-finite greedy logprobs (NaN outputs) is flagged: one line on stderr
    while it runs, and its table row gives the probe's count and the share of its output tokens that decode to text
    (NaN outputs are token 0, no text); a finite probe prints nothing and reads 0/16."""
    from benchmarks import serve_and_bench as sb

    nan = {"generate_logprobs": [None] * 16}
    sb.warn_non_finite("flashmla", nan)
    assert "flashmla: 16/16 of the endpoint probe's greedy logprobs are not finite" in capsys.readouterr().err
    sb.warn_non_finite("snapmla", {"generate_logprobs": [-0.5] * 16})
    sb.warn_non_finite("snapmla", {"generate": ""})  # a run saved before the probe kept its logprobs
    assert capsys.readouterr().err == ""
    # the line every run prints once its probe returns, NaN or not (a run stopped later keeps it in its log)
    assert sb.probe_line("snapmla", {"startup_s": 41.5, "endpoints": {"generate_logprobs": [-0.5] * 16}}) == (
        "serve_and_bench: snapmla: answered in 41.5 s; endpoint probe: 0/16 greedy logprobs not finite")
    assert "probe: 16/16 greedy" in sb.probe_line("flashmla", {"startup_s": 1, "endpoints": nan})
    runs = [{"run": "flashmla", "total_tok_s": 1.0, "output_tok_s": 1.0, "output_tokens": 92160.0,
             "retokenized_output_tokens": 12772.0, "endpoints": nan},
            {"run": "snapmla", "output_tokens": 100.0, "retokenized_output_tokens": 99.0,
             "endpoints": {"generate_logprobs": [-0.5] * 16}}]
    rows = sb.table(runs).splitlines()
    assert rows[2].endswith("| 0.14 | 16/16 |") and rows[3].endswith("| 0.99 | 0/16 |"), rows
    # the plot's labels: the flagged run says what its outputs were, a run of text outputs only its name
    assert [sb.run_label(r) for r in runs] == ["flashmla\nprobe NaN 16/16, text 0.14", "snapmla"]
    assert sb.run_label({"run": "x", "output_tokens": 10.0, "retokenized_output_tokens": 5.0}) == "x\ntext 0.50"
    assert sb.run_label({"run": "y", "endpoints": {"generate_logprobs": [None, -1.0]}}) == "y\nprobe NaN 1/2"


def test_endpoint_check_keeps_the_greedy_tokens_and_their_logprobs(monkeypatch):
    """The /generate request of the endpoint check asks for logprobs, and the run's JSON keeps its token ids and
    logprobs (a NaN one arrives as null) beside the three texts."""
    from benchmarks import serve_and_bench as sb

    sent = {}

    def post(port, path, body):
        sent[path] = body
        if path == "/generate":
            tokens = [[-0.5, 7, None]] * 15 + [[None, 0, None]]
            return {"text": "", "meta_info": {"completion_tokens": 16, "output_token_logprobs": tokens}}
        if path == "/v1/completions":
            return {"choices": [{"text": "x"}]}
        return {"choices": [{"message": {"content": "y"}}]}

    monkeypatch.setattr(sb, "post", post)
    out = sb.check_endpoints(30000, "m")
    assert sent["/generate"]["return_logprob"] is True
    assert out["generate_ids"] == [7] * 15 + [0] and out["generate_logprobs"] == [-0.5] * 15 + [None]
    assert (out["generate"], out["completions"], out["chat"]) == ("", "x", "y")


def test_a_run_cut_while_its_server_stops_keeps_its_measured_row(monkeypatch, tmp_path):
    """serve_and_bench's main saves a run's row as soon as its bench has returned: a time limit that kills it
    while the server stops (SIGTERM, up to 30 s) still leaves the measured run in serve_bench.json."""
    import sys
    import types

    from benchmarks import serve_and_bench as sb

    def killed_while_stopping(proc, log):
        log.close()
        raise KeyboardInterrupt  # what a time limit does to serve_and_bench at this point

    monkeypatch.setattr(sb, "start_server", lambda *a, **k: (types.SimpleNamespace(cmd="c", pid=1), open(a[3], "w")))
    monkeypatch.setattr(sb, "wait_healthy", lambda *a: None)
    monkeypatch.setattr(sb, "check_endpoints", lambda *a: {})
    monkeypatch.setattr(sb, "kill_servers_on_exit", lambda: None)
    monkeypatch.setattr(sb, "stop_server", killed_while_stopping)
    monkeypatch.setattr(sb, "bench_serving", lambda *a, **k: ({"output_tok_s": 7.0, "completed": 3.0}, "text"))
    monkeypatch.setattr(sys, "argv", ["serve_and_bench", "--runs", "snapmla", "--out", str(tmp_path),
                                      "--warmup-prompts", "0", "--num-prompts", "3"])
    with pytest.raises(KeyboardInterrupt):
        sb.main()
    rows = json.loads((tmp_path / "serve_bench.json").read_text())
    assert [(r["run"], r["output_tok_s"]) for r in rows] == [("snapmla", 7.0)]


def test_merge_rebuilds_a_run_whose_bench_printed_but_whose_row_was_not_saved(tmp_path):
    """`--merge`: a folder with bench_RUN.txt but no row for RUN (serve_and_bench killed after that bench) gives a row
    rebuilt from the bench summary and the server log, with the folder's workload, marked `recovered`; a row saved
    before its server stopped gets its pool and peak from its log; a folder with no row at all to give the workload
    stops with the reason."""
    from benchmarks import serve_and_bench as sb

    cut = tmp_path / "cut"
    cut.mkdir()
    workload = {"model": "m", "input_len": 8192}
    (cut / "serve_bench.json").write_text(json.dumps([{"run": "snapmla", "workload": workload, "output_tok_s": 9.0}]))
    (cut / "bench_flashmla-fp8.txt").write_text(
        "Successful requests:                     120\nOutput token throughput (tok/s):          950.04\n"
        "Median TTFT (ms):                        32246.50\n")
    (cut / "server_flashmla-fp8.log").write_text(
        "[x] max_total_num_tokens=1210944, chunked_prefill_size=8192\n" + _batch_line("00:01", "Decode", 0))
    (cut / "server_snapmla.log").write_text("[x] max_total_num_tokens=1083072, chunked_prefill_size=8192\n")
    merged = sb.merge_folders([cut], tmp_path / "out")
    assert (merged[0]["run"], merged[0]["pool_tokens"]) == ("snapmla", 1083072)
    fp8 = next(r for r in merged if r["run"] == "flashmla-fp8")
    assert fp8["recovered"] and fp8["workload"] == workload
    assert (fp8["output_tok_s"], fp8["median_ttft_ms"], fp8["completed"]) == (950.04, 32246.5, 120.0)
    assert (fp8["pool_tokens"], fp8["peak_running_req"]) == (1210944, 4)
    assert not merged[0].get("recovered") and (tmp_path / "out/bench_flashmla-fp8.txt").exists()
    lone = tmp_path / "lone"
    lone.mkdir()
    (lone / "serve_bench.json").write_text("[]")
    (lone / "bench_snapmla.txt").write_text("Successful requests: 1\n")
    with pytest.raises(SystemExit, match="no saved run"):
        sb.merge_folders([lone], tmp_path / "out2")


def test_merge_fills_a_bench_figure_the_saved_row_has_no_key_for_from_its_bench_text(tmp_path):
    """A run saved before METRICS had `accept_length` (results/serve/v3_fp8_tp8_h200_mtp: no such key in its JSON)
    gets it from its bench_serving text on `--merge`; a run without speculative decoding has no such line: None."""
    from benchmarks import serve_and_bench as sb
    from harness.bench_serving import parse_metrics

    from pathlib import Path

    saved = Path(__file__).resolve().parents[2] / "results/serve/v3_fp8_tp8_h200_mtp"
    assert "accept_length" not in sb.read_json(saved / "serve_bench.json")[0]
    merged = sb.merge_folders([saved], tmp_path / "out")
    assert [(r["run"], r["accept_length"]) for r in merged] == [("snapmla-mtp", 1.66)]
    assert parse_metrics("Successful requests:                     64\n")["accept_length"] is None
