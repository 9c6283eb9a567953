"""tools/soak.py against a loopback stand-in of SGLang's HTTP API: a server that holds up passes every check; one
that dies during the load, answers a well-formed request with 500, lets a bad id through, or leaks pool tokens
fails the check that names it."""

import json
import threading
import time

import pytest

from local_http import QuietHandler, local_http_server
from tools import soak

VOCAB = 1000
STALL = 3.0  # seconds a stalled answer takes; the stall tests' client waits STALL_TIMEOUT
STALL_TIMEOUT = 1.5


def stand_in(fault: str | None):
    """A handler class: /generate (whole or streamed, greedy output = a function of the prompt and of whether other
    requests are in flight, as dummy weights' near-flat logits are of the batch), /abort_request, /health, /metrics
    (tokens in use and running requests: those of requests in flight; waiting requests: the stalled ones, which hold
    no tokens yet, as SGLang's queue during a compile). `fault`: "dies" (after 40 requests every answer is 503 / a
    closed connection), "500" (every 7th well-formed request of the load), "lets-bad-ids-through",
    "leaks" (the gauge never returns to 0), "stalls" (every 7th well-formed request of the load answered after
    STALL seconds, past the client's timeout the stall tests set), "stalls-first" (every well-formed one in the
    load's first second so), "prefix-hit-differs" (a prompt seen before gets other tokens until /flush_cache empties
    what it remembers: dummy weights' near-flat logits under a prefix hit)."""
    state = {"requests": 0, "in_flight": 0, "queued": 0, "lock": threading.Lock(), "cached": set()}

    class Handler(QuietHandler):
        protocol_version = "HTTP/1.1"

        def _send(self, status, body: bytes, content_type="application/json"):
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def dead(self):
            return (fault == "dies" and state["requests"] > 40) or state.get("gathered-bad-id", False)

        def do_GET(self):
            if self.dead():
                return self._send(503, b"")
            if self.path == "/health":
                return self._send(200, b"")
            if self.path == "/metrics":
                used = state["in_flight"] * 100 + (7 if fault == "leaks" else 0)
                return self._send(200, (f'sglang:num_used_tokens{{tp_rank="0"}} {used}\n'
                                        f'sglang:num_running_reqs{{tp_rank="0"}} {state["in_flight"]}\n'
                                        f'sglang:num_queue_reqs{{tp_rank="0"}} {state["queued"]}\n').encode(),
                                  "text/plain")
            return self._send(404, b"{}")

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            with state["lock"]:
                state["requests"] += 1
                n = state["requests"]
            if self.dead():
                self.close_connection = True
                return
            if self.path == "/abort_request":
                return self._send(200, b"{}")
            if self.path == "/flush_cache":
                state["cached"].clear()
                return self._send(200, b"Cache flushed.")
            try:
                req = json.loads(body)
                ids, new = req["input_ids"], int(req["sampling_params"].get("max_new_tokens", 4))
                stop = req["sampling_params"].get("stop_token_ids") or []
                float(req["sampling_params"].get("temperature", 0))
                if fault == "dies-of-bad-ids" and any(isinstance(i, int) and not 0 <= i < VOCAB
                                                       for i in [*ids, *stop]):
                    state["gathered-bad-id"] = True  # SGLang's way: the id reaches the GPU and the scheduler dies
                    self.close_connection = True
                    return
                if fault != "lets-bad-ids-through" and (
                        new < 0 or any(not isinstance(i, int) or not 0 <= i < VOCAB for i in [*ids, *stop])
                        or (req.get("return_logprob") and not 0 <= req.get("top_logprobs_num", 0) <= VOCAB)):
                    raise ValueError("token id or top-logprob count out of range")
            except (ValueError, KeyError, TypeError) as e:
                return self._send(400, json.dumps({"error": {"message": str(e)}}).encode())
            if fault == "500" and n % 7 == 0 and new >= 8:  # load requests only (the probes ask for 4 tokens)
                return self._send(500, b'{"error": "internal"}')
            stalled = (fault == "stalls" and n % 7 == 0 and new >= 8) or (  # the first second of load: a fresh host
                fault == "stalls-first" and new >= 8  # compiling kernels for new batch sizes
                and time.time() - state.setdefault("first", time.time()) < 1)
            with state["lock"]:
                batched = state["in_flight"] + state["queued"] > 0
                state["queued" if stalled else "in_flight"] += 1
            if stalled:
                time.sleep(STALL)
                with state["lock"]:
                    state["queued"] -= 1
                    state["in_flight"] += 1
            held = [True]

            def release():  # once the output is made, before its last bytes go out: a client that has read them
                with state["lock"]:  # and sends its next request finds this one gone, as SGLang frees it first
                    state["in_flight"] -= held.pop() if held else 0

            try:
                out = [(sum(ids) + k + 2 * batched) % VOCAB for k in range(new)]
                if fault == "prefix-hit-differs" and tuple(ids) in state["cached"]:
                    out = [(t + 1) % VOCAB for t in out]
                state["cached"].add(tuple(ids))
                if not req.get("stream"):
                    release()
                    return self._send(200, json.dumps({"output_ids": out}).encode())
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for k in range(len(out)):
                    if k == len(out) - 1:
                        release()
                    self.wfile.write(f"data: {json.dumps({'output_ids': out[: k + 1]})}\n\n".encode())
                    self.wfile.flush()
                    time.sleep(0.002)
                self.close_connection = True
            except OSError:  # the client cut the stream
                self.close_connection = True
            finally:
                release()

    return Handler


def run(fault, client_timeout=60.0, **kw):
    """A 3-second soak of the stand-in; the client's timeout is long unless a stall test shortens it below STALL."""
    with local_http_server(stand_in(fault)) as server:
        return soak.soak(server.server_port, seconds=3, clients=6, vocab=VOCAB, probe_count=3, probe_tokens=4,
                         max_new_tokens=24, idle_seconds=3, client_timeout=client_timeout, **kw)


def test_a_server_that_holds_up_passes_every_check():
    result = run(None)
    assert all(result["checks"].values()), soak.table(result)
    assert all(result["statuses"][k] for k in soak.WEIGHTS), result["statuses"]


@pytest.mark.parametrize("fault,failed", [
    ("dies", ["server alive (/health)", "no 5xx or broken connection for well-formed requests"]),
    ("500", ["no 5xx or broken connection for well-formed requests"]),
    ("lets-bad-ids-through", ["malformed answered 4xx with a message"]),
    ("leaks", ["tokens in use back to 0 when idle"]),
    ("stalls", ["every well-formed request answered within the client's timeout"]),
])
def test_each_fault_fails_its_check(fault, failed):
    result = run(fault, **({"client_timeout": STALL_TIMEOUT} if fault == "stalls" else {}))
    seen = [name for name, ok in result["checks"].items() if not ok]
    # a server that died fails whatever needs it afterwards too (probes, the idle gauge)
    assert set(failed) <= set(seen) if fault == "dies" else seen == failed, soak.table(result)
    if fault == "stalls":  # counted apart from broken connections, and named so in the table
        assert "timed out: " in soak.table(result) and not any(
            "0" in result["statuses"][k] for k in ("complete", "cut", "abort")), result["statuses"]



def test_a_backend_without_id_checks_dies_of_out_of_range_ids_and_is_soaked_without_them():
    """A stand-in that dies of the first out-of-range id (SGLang without snapmla's checks) fails the full soak; the
    kinds of --without-out-of-range-ids hold none of those, and its soak passes."""
    assert not run("dies-of-bad-ids")["checks"]["server alive (/health)"]
    kinds = soak.malformed_kinds(without_out_of_range_ids=True)
    assert kinds and not set(kinds) & set(soak.OUT_OF_RANGE_IDS)
    assert soak.malformed_kinds(without_out_of_range_ids=False) == tuple(soak.MALFORMED)
    result = run("dies-of-bad-ids", malformed=kinds)
    assert all(result["checks"].values()), soak.table(result)


def test_retractions_are_counted_from_the_server_log_and_required_on_request(tmp_path):
    """The scheduler's "#retracted_reqs" lines written during the soak are summed; --min-retractions fails a soak whose
    pool never forced one."""
    log = tmp_path / "server.log"
    log.write_text("[t] KV cache pool is full. Retract requests. #retracted_reqs: 9, #new_tokens_gained: 1\n")
    assert soak.retracted_requests(log.read_text()) == 9
    text = "KV cache pool is full. Retract requests. #retracted_reqs: 3, #new_tokens_gained: 40\n" * 2
    assert soak.retracted_requests(text) == 6
    result = run(None, server_log=log, min_retractions=1)  # lines already in the log before the soak do not count
    assert result["retracted_requests"] == 0
    assert [n for n, ok in result["checks"].items() if not ok] == ["at least 1 requests retracted"], soak.table(result)
    assert "requests retracted: 0" in soak.table(result)


@pytest.mark.parametrize("load_format", ["auto", "dummy"])
def test_start_loads_the_checkpoint_or_a_config_on_dummy_weights(monkeypatch, tmp_path, load_format):
    """`--start` serves the checkpoint's weights by default and a bundled config (no weights) with `--load-format
    dummy`, the soak's flags added to the run's."""
    import contextlib

    import harness.server

    seen = {}

    @contextlib.contextmanager
    def serving(model, port, flags, log, timeout, **kwargs):
        seen.update(model=model, flags=flags, **kwargs)
        yield None

    monkeypatch.setattr(harness.server, "serving", serving)
    monkeypatch.setattr(harness.server, "kill_servers_on_exit", lambda: None)
    monkeypatch.setattr(soak, "run_soak", lambda args: {"checks": {"holds": True}})
    monkeypatch.setattr(soak, "table", lambda result: "")
    argv = ["--start", "snapmla", "--model", "configs/models/deepseek-v3-fp8-tp8", "--out", str(tmp_path)]
    assert soak.main([*argv, *(["--load-format", load_format] if load_format == "dummy" else [])]) == 0
    assert seen["load_format"] == load_format and seen["model"] == "configs/models/deepseek-v3-fp8-tp8"
    assert seen["flags"][:3] == ["--attention-backend", "snapmla", "--enable-metrics"]


def test_an_idle_wait_shorter_than_sglangs_gauge_window_is_refused(monkeypatch, tmp_path, capsys):
    """SGLang 0.5.17 republishes an idle server's gauges 30 s after its last report: a 20 s wait can read a finished
    prefill's pool tokens as a leak (an H200 soak whose load had no time left did). The CLI refuses such a wait before
    it starts a server, and names the fix."""
    monkeypatch.setattr(soak, "run_soak", lambda args: pytest.fail("a soak ran with a too-short idle wait"))
    with pytest.raises(SystemExit) as exit_:
        soak.main(["--port", "1", "--idle-seconds", "20", "--out", str(tmp_path)])
    assert exit_.value.code == 2 and f"--idle-seconds {soak.MIN_IDLE_SECONDS} or more" in capsys.readouterr().err
    monkeypatch.setattr(soak, "run_soak", lambda args: {"checks": {"holds": True}})
    monkeypatch.setattr(soak, "table", lambda result: "")
    assert soak.main(["--port", "1", "--idle-seconds", str(soak.MIN_IDLE_SECONDS), "--out", str(tmp_path)]) == 0


def test_the_probes_after_a_flush_are_the_probes_before_computed_again():
    """A server whose prefix hits give other tokens (dummy weights) fails the probe check over its cache and passes it
    with --flush-before-probes-after, which is then a check of its own (the flush answered)."""
    over_cache = run("prefix-hit-differs")
    assert [k for k, ok in over_cache["checks"].items() if not ok] == ["probes after == before"]
    flushed = run("prefix-hit-differs", flush_before_probes_after=True)
    assert all(flushed["checks"].values()), soak.table(flushed)
    assert flushed["checks"]["radix cache flushed before the probes after"]


def test_a_connect_timeout_is_a_timeout_and_a_reset_is_a_broken_connection():
    """urllib wraps a connect that runs past the timeout in URLError; a reset or refused connection stays broken."""
    import socket
    import urllib.error

    assert soak.failed_status(urllib.error.URLError(socket.timeout("timed out"))) == soak.TIMED_OUT
    assert soak.failed_status(TimeoutError()) == soak.TIMED_OUT
    assert soak.failed_status(urllib.error.URLError(ConnectionRefusedError())) == 0
    assert soak.failed_status(ConnectionResetError()) == 0


def test_a_warmup_takes_a_fresh_hosts_first_stall_out_of_the_checks():
    """A server that stalls only at its first load (a fresh host compiling kernels) fails the timeout check; with
    --warmup-seconds the stall falls in the unchecked warm-up, whose statuses are kept apart."""
    cold = run("stalls-first", client_timeout=STALL_TIMEOUT)
    assert [name for name, ok in cold["checks"].items() if not ok] == [
        "every well-formed request answered within the client's timeout"], soak.table(cold)
    warm = run("stalls-first", client_timeout=STALL_TIMEOUT, warmup_seconds=1.5)
    # the warm-up's stalled requests, given up by their clients, are still served when the warm-up ends: the probes
    # before wait for them (a probe among them gets other tokens)
    assert all(warm["checks"].values()), soak.table(warm)
    assert warm["checks"]["idle before the probes before (the warm-up's requests done)"]
    assert sum(warm["warmup_statuses"]["complete"].values()) and "warmup_statuses" not in cold


def test_a_server_still_busy_after_the_warmup_fails_the_idle_check():
    """Its gauges never return to 0 ("leaks"): the probes before wait the client's timeout plus --idle-seconds, then
    run, and the check says they may not have run alone."""
    result = run("leaks", client_timeout=4.0, warmup_seconds=0.5)
    assert [name for name, ok in result["checks"].items() if not ok] == [
        "tokens in use back to 0 when idle", "idle before the probes before (the warm-up's requests done)"]
    assert result["after_warmup"]["num_used_tokens"] == 7


def test_finish_by_shortens_the_load_to_end_in_time_and_fails_when_too_little_is_left(monkeypatch):
    """--finish-by: the measured load is cut to what the budget leaves after the idle wait, the probes after and the
    margin, and the run ends within the budget; a budget that leaves less than --min-load-seconds fails its check;
    one that leaves more than --seconds keeps the asked length."""
    import time

    monkeypatch.setattr(soak, "FINISH_MARGIN_S", 0.5)
    roomy = run(None, finish_by=60, min_load_seconds=2)
    assert roomy["seconds"] == roomy["seconds_asked"] == 3 and all(roomy["checks"].values()), soak.table(roomy)
    started = time.monotonic()
    cut = run(None, finish_by=6, started=started, min_load_seconds=0.5)  # idle 3 s + probes + 0.5 s leave < 3 s
    took = time.monotonic() - started
    assert cut["seconds_asked"] == 3 and 0.5 <= cut["seconds"] <= 2.5 and cut["load_s"] < 3, cut
    assert all(cut["checks"].values()) and took < 6 + 1.5, (took, soak.table(cut))
    short = run(None, finish_by=6, started=time.monotonic() - 1, min_load_seconds=2.5)  # 1 s of it already gone
    assert 0.5 <= short["seconds"] < 2.5, short
    assert [n for n, ok in short["checks"].items() if not ok] == [
        "a measured load of at least 2.5 s within --finish-by"], soak.table(short)
