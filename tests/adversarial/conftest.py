"""Servers that misbehave on purpose for the adversarial tests: a loopback TCP
server on a free port whose answer to each request is whatever a test scripts
(wrong JSON, a redirect, a trickle, silence), recording every request it got."""
from __future__ import annotations

import contextlib
import socket
import threading
from typing import Callable

import pytest

Answer = Callable[[socket.socket, bytes, threading.Event], None]


def read_request(conn: socket.socket) -> bytes:
    """One HTTP request off conn: the head and as much body as Content-Length says."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


def header(request: bytes, name: str) -> str | None:
    for line in request.split(b"\r\n\r\n")[0].split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == name.lower().encode():
            return value.strip().decode()
    return None


def reply(status: int, body: bytes = b"{}", headers: dict[str, str] | None = None) -> Answer:
    """An answer: this status and body, with a Content-Length."""
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())

    def answer(conn, _request, _stopped):
        conn.sendall(f"HTTP/1.1 {status} X\r\nContent-Length: {len(body)}\r\n{extra}"
                     "Connection: close\r\n\r\n".encode() + body)
    return answer


class Scripted:
    """A TCP server on a free 127.0.0.1 port; every request gets answer(conn, request, stopped)."""

    def __init__(self, answer: Answer):
        self.answer = answer
        self.requests: list[bytes] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.1)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/admin/config"
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            conn.settimeout(10)
            request = read_request(conn)
            self.requests.append(request)
            self.answer(conn, request, self.stopped)

    def close(self) -> None:
        self.stopped.set()
        self.thread.join()
        self.sock.close()


@pytest.fixture
def serve():
    """serve(answer) -> a running Scripted server, closed after the test."""
    servers = []

    def start(answer: Answer) -> Scripted:
        servers.append(Scripted(answer))
        return servers[-1]
    yield start
    for server in servers:
        server.close()


@pytest.fixture
def token_file(tmp_path):
    path = tmp_path / "admin.token"
    path.write_text("s3cret-token-42\n")
    path.chmod(0o600)
    return path
