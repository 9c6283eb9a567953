"""benchmarks/serve_steady.py: the steady window of a server log, the request count for a pool, and that every
backend of a run (also one resumed later) serves the same requests."""

import json
from datetime import datetime, timedelta

import pytest

from benchmarks import serve_steady
from harness.server_log import decode_lines


def _decode(t: int, running: int, usage: float, rate: float, queue: int) -> str:
    return (f"[2026-11-22 10:{t // 60:02d}:{t % 60:02d}] Decode batch, #running-req: {running}, #token: 1, "
            f"token usage: {usage:.2f}, cuda graph: True, gen throughput (token/s): {rate:.2f}, #queue-req: {queue}")


def _prefill(t: int) -> str:
    return (f"[2026-11-22 10:{t // 60:02d}:{t % 60:02d}] Prefill batch, #new-seq: 2, #new-token: 8192, "
            f"#cached-token: 0, token usage: 0.50, #running-req: 2, #queue-req: 40, input throughput (token/s): 1.00")


# a burst: ramp-up (prefill batches only: SGLang prefills while it can admit), the first fill decoding alone (pool
# full, 600 waiting, nobody admitted: the fastest lines of the run), the first wave of finishes and admissions, then a
# full pool with requests waiting once a pool's worth (300) has been admitted again (rates and batch sizes vary,
# prefill batches in between), then the tail (nothing waiting, the pool draining)
FILL = [(2, 300, 0.88, 13000.0, 600), (3, 300, 0.96, 13000.0, 600)]
WAVE = [(4, 290, 0.95, 9000.0, 500), (5, 300, 0.96, 9500.0, 380)]
STEADY = [(6, 300, 0.95, 12000.0, 300), (7, 280, 0.97, 8000.0, 200), (9, 310, 0.96, 12400.0, 90),
          (10, 290, 0.94, 11600.0, 10)]
TAIL = [(11, 200, 0.60, 9000.0, 0), (12, 60, 0.20, 3000.0, 0), (13, 5, 0.02, 400.0, 0)]
LOG = "\n".join([_prefill(0), _prefill(1)] + [_decode(*r) for r in FILL + WAVE] + [_prefill(6)]
                + [_decode(*r) for r in STEADY[:2]] + [_prefill(8)] + [_decode(*r) for r in STEADY[2:]]
                + [_decode(*r) for r in TAIL])


def test_the_steady_window_is_the_full_pool_with_requests_waiting_after_the_first_fill_and_wave():
    lines = decode_lines(LOG)
    assert len(lines) == len(FILL + WAVE + STEADY + TAIL)  # prefill lines are not decode lines
    w = serve_steady.steady_window(lines, usage_floor=0.9)
    first = len(FILL + WAVE)
    assert (w["first"], w["last"], w["lines"], w["seconds"]) == (first, first + 3, 4, 4.0)
    # tokens over time: each line's tokens are running x interval, its time running x interval / rate
    expected = sum(r[1] for r in STEADY) / sum(r[1] / r[3] for r in STEADY)
    assert w["output_tok_s"] == pytest.approx(expected, abs=0.1)
    assert w["output_tok_s"] != pytest.approx(sum(r[3] for r in STEADY) / len(STEADY), abs=1.0)
    assert w["mean_running"] == pytest.approx(sum(r[1] for r in STEADY) / len(STEADY), abs=0.1)


def test_the_window_breakdown_tells_decoding_alone_from_the_time_around_prefill_batches():
    # the steady lines' prefill batches: STEADY[0] and STEADY[2] follow one of 8192 tokens (LOG), the others none
    w = serve_steady.steady_window(decode_lines(LOG), usage_floor=0.9, interval=10)
    alone = [STEADY[1], STEADY[3]]
    alone_rate = sum(r[1] for r in alone) / sum(r[1] / r[3] for r in alone)
    assert w["decode_alone_tok_s"] == pytest.approx(alone_rate, abs=0.1)
    # the lines after a prefill take running x 10 / rate seconds; decoding alone would take running x 10 / alone_rate
    extra = sum(r[1] * 10 * (1 / r[3] - 1 / alone_rate) for r in (STEADY[0], STEADY[2]))
    assert w["prefill_us_per_token"] == pytest.approx(1e6 * extra / (2 * 8192), abs=0.1)
    assert w["prefill_tokens_per_output"] == pytest.approx(2 * 8192 / sum(r[1] * 10 for r in STEADY), abs=1e-3)
    # lines without prefill counts (a JSON written before they were logged): no breakdown, the window stays
    bare = [{k: v for k, v in line.items() if k != "prefill_tokens"} for line in decode_lines(LOG)]
    assert "decode_alone_tok_s" not in serve_steady.steady_window(bare)
    assert serve_steady.steady_window(bare)["output_tok_s"] == w["output_tok_s"]


def _gpu_samples(decode_per_s: float, extend_per_s: float, seconds: int = 14) -> list[dict]:
    """GPU-time samples every second of LOG's minute (10:00:00 on), the counters growing at the given rates."""
    t0 = datetime(2026, 11, 22, 10, 0, 0)
    return [{"time": (t0 + timedelta(seconds=t)).isoformat(),
             "seconds": {"decode": decode_per_s * t, "extend": extend_per_s * t, "idle": 0.0}}
            for t in range(seconds + 1)]


def test_the_gpu_breakdown_splits_the_window_into_decode_prefill_and_outside_forwards():
    # the steady window runs from the line at 10:00:06 to the one at 10:00:10, each taken at its second's middle
    run = serve_steady.measured_run(LOG, 0.9, 10, _gpu_samples(0.6, 0.3))
    s = run["steady"]
    assert (s["gpu_decode_share"], s["gpu_prefill_share"], s["gpu_outside_share"]) == (0.6, 0.3, 0.1)
    # 4 s of which 2.4 s in decode forwards over the 3 lines x 10 steps after the window's first line; 1.2 s in
    # extend forwards for the one prefill batch (8192 tokens) logged inside the window (the one at 10:00:06 is not)
    assert s["decode_gpu_ms_per_step"] == pytest.approx(2400 / 30, abs=0.01)
    assert s["prefill_gpu_us_per_token"] == pytest.approx(1.2e6 / 8192, abs=0.1)
    assert "| 60 / 30 / 10 | 80.0 | 146.5 |" in serve_steady.table({"backends": {"snapmla": {**run, "steady": s}}})
    # samples that stop before the window ends (or none): the window without the breakdown
    short = serve_steady.measured_run(LOG, 0.9, 10, _gpu_samples(0.6, 0.3, seconds=9))["steady"]
    assert "gpu_decode_share" not in short and short["output_tok_s"] == s["output_tok_s"]
    assert "gpu_decode_share" not in serve_steady.measured_run(LOG, 0.9, 10)["steady"]


def test_speculative_decoding_steps_count_as_decode_gpu_time():
    """With MTP no forward is labelled "decode": a step is a draft, a verify and a draft-extend forward, and each of
    them is decode time of the window (with "decode" alone, an MTP run shows 0 % decode and shares that do not add
    up to the window)."""
    samples = [{**x, "seconds": {"extend": x["seconds"]["extend"], "eagle_draft": 0.1 / 0.6 * x["seconds"]["decode"],
                                 "target_verify": 0.4 / 0.6 * x["seconds"]["decode"],
                                 "eagle_draft_extend": 0.1 / 0.6 * x["seconds"]["decode"]}}
               for x in _gpu_samples(0.6, 0.3)]
    s = serve_steady.measured_run(LOG, 0.9, 10, samples)["steady"]
    assert (s["gpu_decode_share"], s["gpu_prefill_share"], s["gpu_outside_share"]) == (0.6, 0.3, 0.1)
    assert s["decode_gpu_ms_per_step"] == pytest.approx(2400 / 30, abs=0.01)


def test_no_steady_window_without_requests_waiting_or_before_a_pools_worth_is_admitted_again():
    assert serve_steady.steady_window(decode_lines("\n".join(_decode(*r) for r in TAIL))) is None
    assert serve_steady.steady_window([]) is None
    # too few requests: the queue empties before a pool's worth has been admitted after the first fill
    short = FILL + WAVE + [(6, 300, 0.95, 12000.0, 320), (7, 280, 0.97, 8000.0, 0)] + TAIL
    assert serve_steady.steady_window(decode_lines("\n".join(_decode(*r) for r in short))) is None


def test_the_engine_rate_counts_the_engine_span_not_the_client_duration():
    lines = decode_lines(LOG)  # decode lines from 10:00:02 to 10:00:13
    # the client counted 11 000 output tokens over 22 s; the engine produced them in 11 s
    r = {"decode_lines": [{**x, "time": x["time"].isoformat()} for x in lines],
         "burst": {"output_tok_s": 500.0, "duration_s": 22.0}}
    assert serve_steady.engine_rate(r) == {"seconds": 11.0, "output_tok_s": 1000.0}
    assert serve_steady.engine_rate({**r, "burst": {}}) is None
    assert serve_steady.engine_rate({**r, "decode_lines": r["decode_lines"][:1]}) is None


def test_prompts_fill_the_pool_the_asked_number_of_times():
    # lengths uniform in [0.5, 1] x 2048: a request holds 1 536 prompt tokens and on average 768 output tokens
    assert serve_steady.prompts_for_pool(2_304_000, 2048, 2048, 0.5, 2.0) == 2000
    assert serve_steady.prompts_for_pool(100, 2048, 2048, 1.0, 1.0) == 1


def test_every_backend_serves_the_requests_sized_from_the_first_pool(monkeypatch, tmp_path):
    pools = {"snapmla": 2_304_000, "flashmla": 1_167_680, "flashmla-fp8": 2_335_360}
    served = []

    def fake_run(model, backend, workload, out, port, args):
        if not workload.get("num_prompts"):
            workload["num_prompts"] = serve_steady.prompts_for_pool(pools[backend], workload["input_len"],
                                                                   workload["output_len"], workload["range_ratio"],
                                                                   args.turnovers)
        served.append((backend, workload["num_prompts"]))
        lines = decode_lines(LOG)
        return {"pool_tokens": pools[backend], "burst": {"total_tok_s": 1000.0, "output_tok_s": 500.0},
                "decode_lines": [{**x, "time": x["time"].isoformat()} for x in lines],
                "steady": serve_steady.steady_window(lines)}

    monkeypatch.setattr(serve_steady, "run_backend", fake_run)
    monkeypatch.setattr(serve_steady, "kill_servers_on_exit", lambda: None)
    serve_steady.main(["--backends", "snapmla", "flashmla", "--out", str(tmp_path)])
    serve_steady.main(["--backends", "snapmla", "flashmla", "flashmla-fp8", "--resume", "--out", str(tmp_path)])
    # three turnovers by default, sized from the first pool; resume ran only the new backend
    assert served == [("snapmla", 3000), ("flashmla", 3000), ("flashmla-fp8", 3000)]
    saved = json.loads((tmp_path / "serve_steady.json").read_text())
    assert saved["workload"]["num_prompts"] == 3000 and set(saved["backends"]) == set(pools)
    assert (tmp_path / "serve_steady.png").stat().st_size > 0
    table = serve_steady.table(saved)
    assert table.count("| 1.00x |") >= 3  # the same made-up rates: every steady and burst ratio is 1.00x
    # --redraw: the table and plot of the JSON as it is, whatever --backends names; nothing served
    (tmp_path / "serve_steady.png").unlink()
    serve_steady.main(["--backends", "snapmla", "triton", "--redraw", "--out", str(tmp_path)])
    assert len(served) == 3 and json.loads((tmp_path / "serve_steady.json").read_text()) == saved
    assert (tmp_path / "serve_steady.png").stat().st_size > 0
    with pytest.raises(SystemExit, match="no .*serve_steady.json"):
        serve_steady.main(["--redraw", "--out", str(tmp_path / "elsewhere")])


@pytest.mark.parametrize("cap,graphs", [(None, 768), (1024, 768), (None, 0)])
def test_every_server_gets_the_workloads_graph_size_running_cap_and_memory(monkeypatch, tmp_path, cap, graphs):
    started = []

    class Server:
        cmd = "server"

    def fake_start(model, port, flags, log_path, **kw):
        started.append(flags)
        return Server(), None

    def not_healthy(*a):
        raise RuntimeError("stop after the start")

    monkeypatch.setattr(serve_steady, "start_server", fake_start)
    monkeypatch.setattr(serve_steady, "wait_healthy", not_healthy)
    monkeypatch.setattr(serve_steady, "stop_server", lambda proc, log: None)
    args = serve_steady.argparse.Namespace(decode_log_interval=10, startup_timeout=1)
    workload = {"cuda_graph_max_bs": graphs, "max_running_requests": cap, "mem_fraction_static": 0.3 if cap else None,
                "server_flags": "--tp 2 --enable-dp-attention --dp 2"}
    res = serve_steady.run_backend("m", "snapmla", workload, tmp_path, 30000, args)
    assert "stop after the start" in res["error"]
    flags = started[0]
    if graphs:
        assert flags[flags.index("--cuda-graph-max-bs") + 1] == "768"
    else:  # the server's default graph size
        assert not any(f.startswith("--cuda-graph") for f in flags)
    if cap:
        assert flags[flags.index("--max-running-requests") + 1] == "1024"
        assert flags[flags.index("--mem-fraction-static") + 1] == "0.3"
    else:
        assert "--max-running-requests" not in flags and "--mem-fraction-static" not in flags
    assert flags[-5:] == ["--tp", "2", "--enable-dp-attention", "--dp", "2"]  # the layout last: it wins


def _tagged(rank: str, row: tuple) -> str:
    return _decode(*row).replace("] Decode", f" {rank} TP{rank[2:]}] Decode")


def test_under_dp_attention_the_steady_window_sums_the_ranks():
    # two DP ranks log their own batches, interleaved; rank 1 carries two thirds of rank 0's requests
    def scaled(rows, k):
        return [(t, int(r * k), u, rate * k, q) for t, r, u, rate, q in rows]

    rows0, rows1 = FILL + WAVE + STEADY + TAIL, scaled(FILL + WAVE + STEADY + TAIL, 2 / 3)
    log = "\n".join(line for a, b in zip(rows0, rows1) for line in (_tagged("DP0", a), _tagged("DP1", b)))
    lines = decode_lines(log)
    assert {line["rank"] for line in lines} == {"DP0", "DP1"}
    steady = serve_steady.measured_run(log, 0.9, 10)["steady"]
    one = serve_steady.steady_window(decode_lines(LOG), 0.9)["output_tok_s"]
    other = serve_steady.steady_window([line for line in lines if line["rank"] == "DP1"], 0.9)["output_tok_s"]
    assert steady["ranks"] == 2 and steady["output_tok_s"] == pytest.approx(one + other, abs=0.2)
    assert steady["output_tok_s"] > 1.5 * one  # not one rank's rate, nor a mean of the two


def test_an_entry_from_the_server_log_reads_the_run_after_the_last_cache_flush(tmp_path):
    warmup = _decode(0, 16, 0.01, 900.0, 8)  # the warm-up's own burst: 8 of its 16 requests waiting
    text = "\n".join(["[2026-11-22 09:59:00] max_total_num_tokens=1120320, chunked_prefill_size=8192",
                      warmup, '[2026-11-22 09:59:58] INFO:     127.0.0.1:1 - "POST /flush_cache HTTP/1.1" 200 OK',
                      LOG])
    entry = serve_steady.entry_from_log(text)
    assert entry["pool_tokens"] == 1120320 and entry["from_log"]
    assert len(entry["decode_lines"]) == len(decode_lines(LOG))  # the warm-up's line is not part of the run
    assert entry["steady"] == serve_steady.steady_window(decode_lines(LOG))
    with pytest.raises(ValueError, match="no cache flush"):
        serve_steady.entry_from_log(LOG)
    # added to a measured run's JSON without serving anything
    log = tmp_path / "server.log"
    log.write_text(text)
    out = tmp_path / "run"
    out.mkdir()
    measured = {"model": "m", "workload": {"num_prompts": 3000, "input_len": 2048, "output_len": 2048,
                                           "range_ratio": 0.5},
                "backends": {"flashmla": {"pool_tokens": 626304, "steady": {"output_tok_s": 5000.0, "seconds": 9.0,
                                                                           "lines": 9}}}}
    (out / "serve_steady.json").write_text(json.dumps(measured))
    serve_steady.main(["--model", "m", "--resume", "--from-log", "snapmla", str(log), "--out", str(out)])
    saved = json.loads((out / "serve_steady.json").read_text())
    assert set(saved["backends"]) == {"flashmla", "snapmla"}
    ratio = entry["steady"]["output_tok_s"] / 5000.0
    assert f"| snapmla (server log) | 1120320 | {entry['steady']['output_tok_s']} | {ratio:.2f}x |" in \
        serve_steady.table(saved)


def _serve_faked(monkeypatch, tmp_path, client, bench_timeout: float = 1.0, **workload) -> dict:
    """run_backend of backend "snapmla" for model "m" with the server faked (its log gets the pool line at start)
    and `client(num_prompts, stream, timeout, log_path)` as bench_serving -> the backend's entry."""
    class Server:
        cmd = "server"

    started, sampling = {}, []

    def fake_start(model, port, flags, log_path, **kw):
        started.update(flags=flags, env=kw.get("env"))
        log_path.write_text("[2026-11-22 09:59:00] max_total_num_tokens=1120320, chunked_prefill_size=8192\n")
        return Server(), None

    class Sampler:
        def __init__(self, port):
            sampling.append("constructed")

        def start(self):
            sampling.append("start")
            return self

        def stop(self):
            sampling.append("stop")
            return _gpu_samples(0.6, 0.3)

    def bench(port, model, input_len, output_len, num_prompts, timeout, **kw):
        sampling.append(f"client {num_prompts}")
        return client(num_prompts, kw["stream"], timeout, tmp_path / "server_m_snapmla.log")

    monkeypatch.setattr(serve_steady, "start_server", fake_start)
    monkeypatch.setattr(serve_steady, "wait_healthy", lambda *a: None)
    monkeypatch.setattr(serve_steady, "stop_server", lambda proc, log: None)
    monkeypatch.setattr(serve_steady, "bench_serving", bench)
    monkeypatch.setattr(serve_steady, "flush_cache", lambda port: None)
    monkeypatch.setattr(serve_steady.gpu_time, "GpuTimeSampler", Sampler)
    args = serve_steady.argparse.Namespace(decode_log_interval=10, startup_timeout=1, bench_timeout=bench_timeout,
                                           usage_floor=0.9, turnovers=3.0)
    workload = {"cuda_graph_max_bs": 1024, "input_len": 2048, "output_len": 2048, "range_ratio": 0.5, **workload}
    res = serve_steady.run_backend("m", "snapmla", workload, tmp_path, 30000, args)
    # the server times its forwards on the GPU, sampled around the measured client alone (not the warm-up)
    assert "--enable-metrics" in started["flags"] and started["env"]["SGLANG_ENABLE_METRICS_DEVICE_TIMER"] == "1"
    assert sampling[0] == "client 16" and sampling[1:3] == ["constructed", "start"] and sampling[-1] == "stop"
    assert len(sampling) == 5 and sampling[3].startswith("client ")
    return res


def _append(log_path, text: str) -> None:
    log_path.write_text(log_path.read_text() + text + "\n")


@pytest.mark.parametrize("stream", [True, False])
def test_a_run_sends_every_request_as_the_workload_says_and_reads_its_log_after_the_flush(monkeypatch, tmp_path,
                                                                                           stream):
    calls = []

    def client(num_prompts, stream_flag, timeout, log_path):
        calls.append((num_prompts, stream_flag))
        # the warm-up (16 requests) logs its own decode line before the harness flushes the cache
        _append(log_path, _decode(0, 16, 0.01, 900.0, 8) if num_prompts == 16 else LOG)
        return {"output_tok_s": 500.0, "duration_s": 22.0}, "bench output"

    res = _serve_faked(monkeypatch, tmp_path, client, num_prompts=None, stream=stream)
    assert "error" not in res, res.get("error")
    prompts = serve_steady.prompts_for_pool(1120320, 2048, 2048, 0.5, 3.0)
    assert calls == [(16, stream), (prompts, stream)]
    # the warm-up's line is not in the run; the window has the GPU breakdown of the samples taken during the run
    assert res["steady"] == serve_steady.measured_run(LOG, 0.9, 10, _gpu_samples(0.6, 0.3))["steady"]
    assert res["steady"]["gpu_prefill_share"] == 0.3 and res["gpu_time_samples"] == _gpu_samples(0.6, 0.3)


def test_a_client_past_its_timeout_leaves_the_steady_window_from_the_server_log(monkeypatch, tmp_path):
    def slow_client(num_prompts, stream, timeout, log_path):
        if num_prompts == 16:
            return {}, ""
        _append(log_path, LOG)  # the server ran the burst; the client did not return in time
        raise serve_steady.subprocess.TimeoutExpired("bench_serving", timeout)

    res = _serve_faked(monkeypatch, tmp_path, slow_client, bench_timeout=300.0, num_prompts=1216)
    assert "error" not in res and "burst" not in res and res["client_timeout_s"] == 300.0
    assert res["steady"] == serve_steady.measured_run(LOG, 0.9, 10, _gpu_samples(0.6, 0.3))["steady"]
    table = serve_steady.table({"backends": {"snapmla": res}})
    assert "| snapmla (client stopped at 300 s) | 1120320 |" in table


def test_serving_without_prometheus_client_stops_with_the_fix(monkeypatch, tmp_path):
    real = serve_steady.importlib.util.find_spec
    monkeypatch.setattr(serve_steady.importlib.util, "find_spec",
                        lambda name, *a: None if name == "prometheus_client" else real(name, *a))
    monkeypatch.setattr(serve_steady, "kill_servers_on_exit", lambda: None)
    monkeypatch.setattr(serve_steady, "run_backend", lambda *a: pytest.fail("served without prometheus-client"))
    with pytest.raises(SystemExit, match="pip install prometheus-client"):
        serve_steady.main(["--backends", "snapmla", "--out", str(tmp_path)])


def test_runs_of_one_workload_merge_side_by_side_and_others_are_refused(tmp_path, capsys):
    """One backend per GPU at once, then --merge: the backends of both runs in one JSON, printed as one table; runs of
    other requests (another --prompts) or the same backend twice stop with the reason."""
    work = {"input_len": 2048, "output_len": 2048, "range_ratio": 0.5, "num_prompts": 1768}
    runs = {}
    for backend in ("snapmla", "flashmla"):
        entry = serve_steady.measured_run(LOG, 0.9, 10)
        runs[backend] = tmp_path / backend / "serve_steady.json"
        runs[backend].parent.mkdir()
        runs[backend].write_text(json.dumps({"model": "m", "workload": work, "backends": {backend: entry}}))
    out = tmp_path / "merged"
    serve_steady.main(["--merge", str(runs["snapmla"]), str(runs["flashmla"]), "--out", str(out)])
    merged = json.loads((out / "serve_steady.json").read_text())
    assert list(merged["backends"]) == ["snapmla", "flashmla"] and merged["workload"] == work
    assert "| snapmla |" in capsys.readouterr().out
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"model": "m", "workload": {**work, "num_prompts": 1500}, "backends": {"triton": {}}}))
    with pytest.raises(SystemExit, match="another workload"):
        serve_steady.main(["--merge", str(runs["snapmla"]), str(other), "--out", str(tmp_path / "x")])
    with pytest.raises(SystemExit, match="snapmla is in more than one run"):
        serve_steady.merge_runs([json.loads(runs["snapmla"].read_text())] * 2)


def test_the_committed_h200_steady_window_is_what_the_docs_quote():
    """results/serve/v2lite_h200_steady gives the rates and ratios README.md and docs/BENCHMARKS.md quote (rounded,
    thin-space thousands as there), read from the window of each server log again."""
    from pathlib import Path

    from harness.results import read_json

    root = Path(__file__).resolve().parents[2]
    docs = (root / "docs" / "BENCHMARKS.md").read_text() + (root / "README.md").read_text()
    saved = read_json(root / "results" / "serve" / "v2lite_h200_steady" / "serve_steady.json")
    steady = {b: e["steady"] for b, e in saved["backends"].items()}
    def quoted(x: float) -> str:  # rounded half up, as the docs round
        return f"{int(x + 0.5):,}".replace(",", " ")

    for backend, (rate, alone) in {"snapmla": ("15 297", "25 177"), "flashmla": ("10 453", "15 150")}.items():
        assert quoted(steady[backend]["output_tok_s"]) == rate and rate in docs, backend
        assert quoted(steady[backend]["decode_alone_tok_s"]) == alone and alone in docs, backend
    for key, ratio in (("output_tok_s", "1.46x"), ("decode_alone_tok_s", "1.66x")):
        assert f"{steady['snapmla'][key] / steady['flashmla'][key]:.2f}x" == ratio and ratio in docs, key
    assert saved["workload"]["num_prompts"] == 1768 and "--prompts 1768" in docs
