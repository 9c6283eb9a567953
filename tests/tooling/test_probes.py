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
            state["payloads"].append((self.path, json.loads(self.rfile.read(int(self.headers["Content-Length"])))))
            if self.path == "/abort_request":
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
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
    ended = server.stream_generate(port, [1, 2, 3], 2, decoding, rid="f00")
    assert decoding.is_set() and ended >= before
    path, sent = state["payloads"][0]
    assert path == "/generate" and sent["stream"] is True and sent["input_ids"] == [1, 2, 3] and sent["rid"] == "f00"
    assert sent["sampling_params"] == {"max_new_tokens": 2, "temperature": 0, "ignore_eos": True}
    server.abort_request(port, "f00")
    assert state["payloads"][1] == ("/abort_request", {"rid": "f00"})
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
        seen_rids.append(obj.rid)

    seen_rids, aborted = [], []
    monkeypatch.setattr(http_server, "_global_state", type("State", (), {"tokenizer_manager": type(
        "Manager", (), {"generate_request": staticmethod(generate_request),
                        "create_abort_task": staticmethod(lambda obj: None),
                        "abort_request": staticmethod(lambda rid="", abort_all=False: aborted.append(rid))})()})())
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
        assert server.stream_generate(port, [1, 2], 2, decoding, rid="ab12") > 0 and decoding.is_set()
        server.abort_request(port, "ab12")
        assert seen_rids == ["ab12"] and aborted == ["ab12"]
        with pytest.raises(RuntimeError, match="the request was refused"):
            server.stream_generate(port, [9], 2, threading.Event())
    finally:
        uv.should_exit = True
        thread.join(timeout=30)


class FakeScheduler:
    """Stands in for a server: a filler decodes `admit_s[i]` s after it is sent (its prefill) and leaves the batch
    `decode_s` s later or when it is aborted; a probe returns after `probe_s`. Records, per probe, how many fillers
    were decoding when it was sent, and the request ids aborted."""

    def __init__(self, admit_s, decode_s, probe_s=0.05):
        self.admit_s, self.decode_s, self.probe_s = admit_s, decode_s, probe_s
        self.decoding, self.lock, self.sent_among = 0, threading.Lock(), []
        self.aborts, self.rids, self.new_tokens = {}, [], []

    def stream_generate(self, port, ids, new_tokens, decoding, rid=None, timeout=900):
        with self.lock:
            aborted = self.aborts.setdefault(rid, threading.Event())
            self.rids.append(rid)
            self.new_tokens.append(new_tokens)
        time.sleep(self.admit_s[ids[0]])
        with self.lock:
            self.decoding += 1
        decoding.set()
        aborted.wait(self.decode_s)
        with self.lock:
            self.decoding -= 1
        return time.monotonic()

    def abort_request(self, port, rid):
        with self.lock:
            self.aborts.setdefault(rid, threading.Event()).set()

    def greedy_generate(self, port, ids, new_tokens, **kw):
        with self.lock:
            self.sent_among.append(self.decoding)
        time.sleep(self.probe_s)
        return {"output_ids": [1] * new_tokens, "meta_info": {"output_token_logprobs": [[-0.1]] * new_tokens}}


def run_level(monkeypatch, scheduler, n_probes, level):
    monkeypatch.setattr(probes, "stream_generate", scheduler.stream_generate)
    monkeypatch.setattr(probes, "greedy_generate", scheduler.greedy_generate)
    monkeypatch.setattr(probes, "abort_request", scheduler.abort_request)
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


def test_fillers_decode_until_the_probes_return_then_leave(monkeypatch):
    """Fillers that would decode far longer than the probes take are aborted once the probes return: the level ends
    then, every filler counted, each aborted under its own request id (one length: SGLang aborts by id prefix)."""
    scheduler = FakeScheduler(admit_s=[0.0] * 12, decode_s=60.0, probe_s=0.2)
    t0 = time.monotonic()
    out = run_level(monkeypatch, scheduler, n_probes=2, level=14)
    assert time.monotonic() - t0 < 10
    assert probes.held(out) == (12, 12)
    assert len(set(scheduler.rids)) == 12 and len({len(r) for r in scheduler.rids}) == 1
    assert all(scheduler.aborts[r].is_set() for r in scheduler.rids)
    assert scheduler.new_tokens == [probes.FILLER_TOKENS_MAX] * 12


def test_filler_length_fits_the_capped_pool():
    """As many new tokens as the capped pool holds for every filler and probe at once, at most FILLER_TOKENS_MAX;
    fillers that leave too little for that are refused by name."""
    probe_prompts = [[1] * 256] * 32
    assert probes.filler_tokens([[1] * 960] * 128, probe_prompts) == probes.FILLER_TOKENS_MAX
    tokens = probes.filler_tokens([[1] * 512] * 480, probe_prompts)
    assert 64 < tokens < probes.FILLER_TOKENS_MAX
    assert 480 * (512 + tokens) + 32 * (256 + probes.PROBE_TOKENS) <= probes.POOL_TOKENS * 9 // 10
    with pytest.raises(ValueError, match="fewer or shorter fillers"):
        probes.filler_tokens([[1] * 1200] * 480, probe_prompts)


def test_a_level_whose_fillers_finish_first_is_named(monkeypatch):
    """Fillers that leave the batch before the probes return (a server that cannot hold the level): the count says
    so and the gate names the level."""
    monkeypatch.setattr(probes, "FILLER_ADMIT_TIMEOUT_S", 0.2)
    scheduler = FakeScheduler(admit_s=[0.0] * 6 + [0.6] * 2, decode_s=0.25, probe_s=0.3)
    out = run_level(monkeypatch, scheduler, n_probes=2, level=10)
    assert probes.held(out) == (0, 8)  # six left while the probes decoded, two started after they were sent
    assert ag.not_held({"1": [{"ids": [1], "logprobs": [0.0]}], "10": out}) == ["c10: 0/8"]


def test_a_filler_error_is_raised_before_the_probes_run(monkeypatch):
    def failing(port, ids, new_tokens, decoding, rid=None, timeout=900):
        raise RuntimeError("server refused the filler")

    def unreachable(port, rid):
        raise ConnectionRefusedError("server gone")

    monkeypatch.setattr(probes, "stream_generate", failing)
    monkeypatch.setattr(probes, "abort_request", unreachable)
    monkeypatch.setattr(probes, "greedy_generate", lambda *a, **k: pytest.fail("a probe ran"))
    with pytest.raises(RuntimeError, match="refused the filler"):
        probes.generate_level(0, [[100]], [[1], [2]], 3)
    with pytest.raises(ConnectionRefusedError):  # after the probes, a server that cannot abort them is an error
        probes.abort_fillers(0, ["a", "b"])
