"""examples/client.py against a local stand-in of SGLang's OpenAI-compatible chat endpoint (loopback only): the
plain completion and the stream (server-sent events) come back as the client prints them."""

import json

import pytest

from examples import client as example
from local_http import QuietHandler, local_http_server


class ChatEndpoint(QuietHandler):
    """POST /v1/chat/completions: the answer 'fp8 pages' whole, or in two SSE chunks when "stream" is set."""

    seen: list = []

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        ChatEndpoint.seen.append((self.path, body))
        base = {"id": "x", "created": 0, "model": body["model"]}
        if not body.get("stream"):
            payload = json.dumps({**base, "object": "chat.completion", "choices": [
                {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "fp8 pages"}}]})
            self.reply("application/json", payload.encode())
            return
        events = [{"role": "assistant", "content": "fp8"}, {"content": " pages"}, {}]
        lines = [json.dumps({**base, "object": "chat.completion.chunk",
                             "choices": [{"index": 0, "delta": d, "finish_reason": None if d else "stop"}]})
                 for d in events]
        self.reply("text/event-stream", "".join(f"data: {x}\n\n" for x in [*lines, "[DONE]"]).encode())


@pytest.fixture
def server():
    ChatEndpoint.seen = []
    with local_http_server(ChatEndpoint) as httpd:
        yield f"http://127.0.0.1:{httpd.server_port}/v1"


def test_chat_and_streamed_chat(server, capsys):
    example.main(["--base-url", server, "--prompt", "what is cached?", "--max-tokens", "8"])
    assert capsys.readouterr().out.splitlines() == ["chat: fp8 pages", "stream: fp8 pages"]
    (path1, plain), (path2, streamed) = ChatEndpoint.seen
    assert path1 == path2 == "/v1/chat/completions"
    assert plain["messages"] == [{"role": "user", "content": "what is cached?"}] and plain["max_tokens"] == 8
    assert streamed["stream"] is True and not plain.get("stream")


def test_without_a_server_one_line_names_the_url(capsys):
    """Nothing listens on the port: one line naming the URL, no traceback."""
    import socket

    with socket.socket() as sock:  # a free port, closed again before the client tries it
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    with pytest.raises(SystemExit) as stop:
        example.main(["--base-url", url])
    assert str(stop.value) == f"no server answers at {url}: start one first (README, Use), or pass --base-url"
