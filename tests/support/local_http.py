"""Loopback HTTP stand-ins for the tests: a handler base that replies with a body and keeps no access log, and a
server on a free port, served from a thread for the duration of a `with` block."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator


class QuietHandler(BaseHTTPRequestHandler):
    def reply(self, content_type: str, data: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@contextmanager
def local_http_server(handler: type[BaseHTTPRequestHandler]) -> Iterator[ThreadingHTTPServer]:
    """A server on 127.0.0.1 at a free port (`server.server_port`); shut down and closed on exit (also when a test
    did so already)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
