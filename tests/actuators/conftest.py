"""Stand-ins for the control surfaces that cannot run here, each a real server on
loopback that records every request it gets and answers what its test scripts:
an HTTP one (Envoy's admin, Triton, SGLang, LiteLLM) and a HAProxy stats socket
(for the answers a real HAProxy would not give)."""
from __future__ import annotations

import json
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable
from urllib.parse import parse_qsl, urlsplit

import pytest


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]      # names lower-cased
    body: bytes

    def json(self):
        return json.loads(self.body)


@dataclass
class Answer:
    status: int = 200
    body: object = field(default_factory=dict)   # JSON unless bytes
    content_type: str = "application/json"


class HttpStandIn:
    """route(request) -> Answer; every request is in .requests, in order."""

    def __init__(self, route: Callable[[Request], Answer]):
        self.route, self.requests = route, []
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def _any(self):
                parts = urlsplit(self.path)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                request = Request(self.command, parts.path, dict(parse_qsl(parts.query, keep_blank_values=True)),
                                  {k.lower(): v for k, v in self.headers.items()}, body)
                stand_in.requests.append(request)
                answer = stand_in.route(request)
                data = answer.body if isinstance(answer.body, bytes) else json.dumps(answer.body).encode()
                self.send_response(answer.status)
                self.send_header("Content-Type", answer.content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = _any

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def http_stand_in():
    started = []

    def start(route: Callable[[Request], Answer]) -> HttpStandIn:
        started.append(HttpStandIn(route))
        return started[-1]
    yield start
    for s in started:
        s.close()


class SocketStandIn:
    """A Unix stream socket that reads one command line per connection, answers
    answer(line) and closes, as HAProxy's stats socket does in non-interactive mode;
    commands lists the lines in the order they were read."""

    def __init__(self, path: Path, answer: Callable[[str], str]):
        self.path, self.answer, self.commands = str(path), answer, []
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.bind(self.path)
        self.sock.listen(8)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        """One connection, on its own thread: a late answer holds up no later command."""
        with conn:
            data = b""
            while not data.endswith(b"\n"):
                chunk = conn.recv(4096)
                if not chunk:
                    break
                data += chunk
            line = data.decode().strip()
            self.commands.append(line)
            try:
                conn.sendall(self.answer(line).encode())
            except OSError:      # the client gave up waiting, as a timed-out actuator does
                pass

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def socket_stand_in(tmp_path):
    started = []

    def start(answer: Callable[[str], str]) -> SocketStandIn:
        started.append(SocketStandIn(tmp_path / f"stand-in-{len(started)}.sock", answer))
        return started[-1]
    yield start
    for s in started:
        s.close()


def token_file(folder: Path, token: str) -> str:
    path = folder / "token"
    path.write_text(token + "\n")
    path.chmod(0o600)
    return str(path)
