"""benchmarks/server_log_stats.py on a synthetic SGLang server log (no server)."""

import lzma

from benchmarks import server_log_stats as sls
from harness import server_log


def _prefill(t, queued, usage=0.01):
    return (f"[2026-11-22 10:00:{t:02d}] Prefill batch, #new-seq: 2, #new-token: 8192, #cached-token: 0, token usage: "
            f"{usage:.2f}, #running-req: 0, #queue-req: {queued}, #pending-token: 0, cuda graph: False, "
            f"input throughput (token/s): {1000.0 * t:.2f}")


def _decode(t, running, rate, usage=0.5):
    return (f"[2026-11-22 10:00:{t:02d} TP0] Decode batch, #running-req: {running}, #token: 1, token usage: "
            f"{usage:.2f}, cuda graph: True, gen throughput (token/s): {rate:.2f}, #queue-req: 0")


def _log():
    lines = ["server_args=ServerArgs(...)", _prefill(1, 0), _prefill(2, 13), _decode(3, 16, 50.0)]  # warm-ups
    lines += [_prefill(10, 3), _prefill(11, 300), _prefill(15, 120), _prefill(20, 0, usage=0.9)]  # the run
    lines += [_decode(21 + i, 320 - i, 1000.0 + 10 * i) for i in range(8)]
    return "\n".join(lines)


def test_stats_of_the_measured_run():
    s = sls.log_stats(_log())
    assert s["peak_running"] == 320
    assert s["decode_tok_s_near_peak"] == 1030.0  # fifth-highest of 1000..1070 and the warm-up's 50
    # 313-320 running are within 5 % of the peak; the first of them follows the run's prefills: median of the 7 others
    assert s["decode_step_ms_at_peak"] == 1000 * 316 / 1040
    assert s["max_token_usage"] == 0.9
    # from the first batch with >= 32 waiting (10:00:11; the warm-up's 13 and the run's first 3 do not count)
    assert s["prefill_span_s"] == 9.0 and s["prefill_batches"] == 3
    assert s["prefill_tok_s_median"] == 15000.0  # the run's batches at 10:00:11, :15, :20
    assert sls.log_stats(_log(), min_queue=2)["prefill_span_s"] == 18.0  # the warm-up's 13 counts then


def test_a_speculative_step_is_a_verify_cycle():
    """With a draft (MTP) a decode line's rate counts the accepted tokens, `accept len` a request per cycle: the step
    at the peak is running x accept length / rate, the cycle that a step without a draft compares with."""
    spec = [_decode(21 + i, 64, 4400.0 + 100 * i).replace(", cuda graph", f", accept len: {2.4 + 0.05 * i:.2f}, "
                                                          "accept rate: 0.70, cuda graph") for i in range(3)]
    decodes = server_log.decode_lines("\n".join(spec))
    assert [d["accept"] for d in decodes] == [2.4, 2.45, 2.5]
    assert sls.log_stats("\n".join(spec))["decode_step_ms_at_peak"] == 1000 * 64 * 2.45 / 4500
    assert [d["accept"] for d in server_log.decode_lines(_log())] == [1.0] * 9  # no draft: one token a step


def test_cli_reads_xz(tmp_path, capsys):
    path = tmp_path / "server_x.log.xz"
    path.write_bytes(lzma.compress(_log().encode()))
    sls.main([str(path)])
    row = capsys.readouterr().out.splitlines()[-1]
    assert row.startswith("| server_x.log.xz | 320 | 1030.0 | 0.9 | 9.0 | 3 |")
    assert row.endswith("| 303.8 | 15000 |")


STARTUP = """/tmp/sglang-runtime/sglang/launch_server.py:56: UserWarning: a warning before the first stamped line
[2026-11-22 23:41:50] server_args=ServerArgs(model_path='m')
[2026-11-22 23:42:26] Chunked prefix cache is turned on.
[2026-11-22 23:42:58 DP0 TP0] Load weight begin. avail mem=138.18 GB
[2026-11-22 23:42:59 DP0 TP0] Capture target decode CUDA graph begin. backend=full
[2026-11-22 23:44:01 DP0 TP0] Using default MoE kernel config. Performance might be sub-optimal!
[2026-11-22 23:44:06 DP0 TP0] Capture target decode CUDA graph end. elapsed=67.47 s
[2026-11-22 23:44:06] Engine startup timings (s): load_weight=0.15, kv_cache_allocation=0.03, scheduler_e2e=72.54, \
cuda_graph={prefill=0.00, decode=67.53, target_verify=0.00}, tokenizer_e2e=108.88
[2026-11-22 23:44:08] The server is fired up and ready to roll!
[2026-11-22 23:50:00] Decode batch, #running-req: 1, #token: 0
"""


def test_the_startup_report_names_where_the_start_went():
    r = server_log.startup_report(STARTUP, gaps=3)
    assert r["log_to_ready_s"] == 138.0  # 23:41:50 to 23:44:08; the decode line after ready is not the start
    assert r["engine"]["cuda_graph.decode"] == 67.53 and r["engine"]["tokenizer_e2e"] == 108.88
    assert r["engine"]["load_weight"] == 0.15 and "cuda_graph.target_verify" in r["engine"]
    assert [round(s) for s, _ in r["silences"]] == [62, 36, 32]
    assert r["silences"][0][1].startswith("Using default MoE kernel config")
    assert server_log.startup_report("[2026-11-22 23:41:50] never ready\n")["log_to_ready_s"] is None
