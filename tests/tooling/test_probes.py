"""The probes' concurrency levels (harness/probes.py): the probes must decode inside a batch that holds every filler
of their level, on a fast host too; and the streamed /generate that tells when a filler decodes (harness/server.py)."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from harness import probes, server
from tools import accuracy_gate as ag


@pytest.fixture
def sse_server():
    """A local HTTP server whose /generate streams `events` (one `data:` line each, then [DONE]) and records the
    payloads it was sent."""
    state = {"events": [], "payloads": []}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            state["payloads"].append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for event in [*map(json.dumps, state["events"]), "[DONE]"]:
                self.wfile.write(f"data: {event}\n\n".encode())
                self.wfile.flush()

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd.server_address[1], state
    httpd.shutdown()


def test_stream_generate_marks_the_first_token_and_returns_when_the_stream_ends(sse_server):
    port, state = sse_server
    state["events"] = [{"text": "a", "output_ids": [5]}, {"text": "b", "output_ids": [5, 6]}]
    decoding = threading.Event()
    before = time.monotonic()
    ended = server.stream_generate(port, [1, 2, 3], 2, decoding)
    assert decoding.is_set() and ended >= before
    sent = state["payloads"][0]
    assert sent["stream"] is True and sent["input_ids"] == [1, 2, 3]
    assert sent["sampling_params"] == {"max_new_tokens": 2, "temperature": 0, "ignore_eos": True}
    state["events"] = [{"error": {"message": "prompt too long"}}]
    with pytest.raises(RuntimeError, match="prompt too long"):
        server.stream_generate(port, [1], 2, threading.Event())


def test_stream_generate_reads_sglangs_own_event_stream(monkeypatch):
    """The installed SGLang's /generate (its FastAPI app, served by uvicorn on a local port) with a tokenizer manager
    that yields two outputs, then one that fails: its server-sent events as SGLang frames them."""
    import socket

    import uvicorn
    from sglang.srt.entrypoints import http_server

    async def generate_request(obj, request=None):
        if obj.input_ids == [9]:
            raise ValueError("the request was refused")
        for n in (1, 2):
            yield {"text": "", "output_ids": [7] * n, "meta_info": {"completion_tokens": n}}

    monkeypatch.setattr(http_server, "_global_state", type("State", (), {"tokenizer_manager": type(
        "Manager", (), {"generate_request": staticmethod(generate_request),
                        "create_abort_task": staticmethod(lambda obj: None)})()})())
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # lifespan off: SGLang's start-up hook wants a running engine; the route alone is what is read here
    uv = uvicorn.Server(uvicorn.Config(http_server.app, host="127.0.0.1", port=port, log_level="error", lifespan="off"))
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not uv.started and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert uv.started, "uvicorn did not start SGLang's app"
        decoding = threading.Event()
        assert server.stream_generate(port, [1, 2], 2, decoding) > 0 and decoding.is_set()
        with pytest.raises(RuntimeError, match="the request was refused"):
            server.stream_generate(port, [9], 2, threading.Event())
    finally:
        uv.should_exit = True
        thread.join(timeout=30)


class FakeScheduler:
    """Stands in for a server: a filler decodes `admit_s[i]` s after it is sent (its prefill) and leaves the batch
    `decode_s` s later; a probe returns after `probe_s`. Records, per probe, how many fillers were decoding when it
    was sent."""

    def __init__(self, admit_s, decode_s, probe_s=0.05):
        self.admit_s, self.decode_s, self.probe_s = admit_s, decode_s, probe_s
        self.decoding, self.lock, self.sent_among = 0, threading.Lock(), []

    def stream_generate(self, port, ids, new_tokens, decoding, timeout=900):
        time.sleep(self.admit_s[ids[0]])
        with self.lock:
            self.decoding += 1
        decoding.set()
        time.sleep(self.decode_s)
        with self.lock:
            self.decoding -= 1
        return time.monotonic()

    def greedy_generate(self, port, ids, new_tokens, **kw):
        with self.lock:
            self.sent_among.append(self.decoding)
        time.sleep(self.probe_s)
        return {"output_ids": [1] * new_tokens, "meta_info": {"output_token_logprobs": [[-0.1]] * new_tokens}}


def run_level(monkeypatch, scheduler, n_probes, level):
    monkeypatch.setattr(probes, "stream_generate", scheduler.stream_generate)
    monkeypatch.setattr(probes, "greedy_generate", scheduler.greedy_generate)
    fillers = [[i] for i in range(level - n_probes)]
    return probes.generate_level(0, [[100 + i] for i in range(n_probes)], fillers, level)


def test_probes_are_sent_once_every_filler_decodes(monkeypatch):
    """Fillers whose prefill takes longer than a fixed pause before the probes: the probes still start inside the
    full batch, and every probe reports all fillers decoding when it returned."""
    scheduler = FakeScheduler(admit_s=[0.06 * i for i in range(12)], decode_s=2.0)
    out = run_level(monkeypatch, scheduler, n_probes=4, level=16)
    assert scheduler.sent_among == [12] * 4
    assert all(p["fillers"] == 12 and p["fillers_running"] == 12 for p in out)
    assert probes.held(out) == (12, 12) and ag.not_held({"16": out}) == []


def test_a_level_whose_fillers_finish_first_is_named(monkeypatch):
    """Fillers that leave the batch before the probes return (a server that cannot hold the level): the count says
    so and the gate names the level."""
    monkeypatch.setattr(probes, "FILLER_ADMIT_TIMEOUT_S", 0.2)
    scheduler = FakeScheduler(admit_s=[0.0] * 6 + [0.6] * 2, decode_s=0.25, probe_s=0.3)
    out = run_level(monkeypatch, scheduler, n_probes=2, level=10)
    assert probes.held(out) == (0, 8)  # six left while the probes decoded, two started after they were sent
    assert ag.not_held({"1": [{"ids": [1], "logprobs": [0.0]}], "10": out}) == ["c10: 0/8"]


def test_a_filler_error_is_raised_before_the_probes_run(monkeypatch):
    def failing(port, ids, new_tokens, decoding, timeout=900):
        raise RuntimeError("server refused the filler")

    monkeypatch.setattr(probes, "stream_generate", failing)
    monkeypatch.setattr(probes, "greedy_generate", lambda *a, **k: pytest.fail("a probe ran"))
    with pytest.raises(RuntimeError, match="refused the filler"):
        probes.generate_level(0, [[100]], [[1], [2]], 3)
