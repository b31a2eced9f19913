"""The daemon's HTTP endpoint: /metrics (Prometheus exposition of its registry)
and /status (the JSON view `slotune status` reads). One thread serves every
client, never a thread each: a client has DEADLINE_S to send a request of at most
HEAD_BYTES and DEADLINE_S again to read the answer, and a client past MAX_CLIENTS
drops the oldest, so idle or trickling clients cannot keep a scrape from its answer."""
from __future__ import annotations

import errno
import io
import json
import logging
import selectors
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler
from typing import Callable, cast

import psutil
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from slotune.host.untrusted import inert

log = logging.getLogger(__name__)

MAX_CLIENTS = 256       # open at once: far below LimitNOFILE=4096, far above scrapers
HEAD_BYTES = 8192       # request line and headers; a Prometheus scrape sends ~250
DEADLINE_S = 5.0        # to send the request, then again to read the answer
PAUSE_S = 0.5           # out of fds with no client to drop: stop accepting this long
OUT_OF_FDS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
TOO_LARGE = b"HTTP/1.0 431 Request Header Fields Too Large\r\nContent-Length: 0\r\n\r\n"
FAILED = b"HTTP/1.0 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n"


class MetricsServer:
    """/metrics and /status on host_port, from one thread, from construction to close()."""

    def __init__(self, address: str, host_port: tuple[str, int], registry: CollectorRegistry,
                 status: Callable[[], dict]):
        self.listener = listen(address, *host_port)
        self.port = self.listener.getsockname()[1]
        self.answering = _answering(registry, status)
        self.clients: dict[socket.socket, _Client] = {}      # oldest first
        self.paused_until = 0.0
        self.wake, self.waker = socket.socketpair()
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ)
        self.selector.register(self.wake, selectors.EVENT_READ)
        self.thread = threading.Thread(target=self._serve, name="exporter", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.waker.send(b"x")
        self.thread.join()
        for sock in [*self.clients, self.listener, self.wake, self.waker]:
            sock.close()
        self.selector.close()

    def _serve(self) -> None:
        while True:
            for key, events in self.selector.select(self._timeout()):
                if key.fileobj is self.wake:
                    return
                if key.fileobj is self.listener:
                    self._accept()
                elif client := self.clients.get(cast(socket.socket, key.fileobj)):   # not dropped this round
                    self._serve_client(client, events)
            now = time.monotonic()
            self._expire(now)
            if self.paused_until and now >= self.paused_until:
                self._resume()

    def _timeout(self) -> float | None:
        soonest = min((c.deadline for c in self.clients.values()), default=self.paused_until or None)
        return None if soonest is None else max(0.0, soonest - time.monotonic())

    def _accept(self) -> None:
        try:
            sock, _ = self.listener.accept()
        except OSError as exc:
            if exc.errno in OUT_OF_FDS:
                self._make_room()
            return
        if len(self.clients) >= MAX_CLIENTS:
            self._drop(next(iter(self.clients)))
        sock.setblocking(False)
        self.clients[sock] = _Client(sock, time.monotonic() + DEADLINE_S)
        self.selector.register(sock, selectors.EVENT_READ)

    def _make_room(self) -> None:
        """Out of fds: drop the oldest client, or with none, stop accepting for PAUSE_S
        (the listener stays readable, and accepting again at once would spin)."""
        if self.clients:
            self._drop(next(iter(self.clients)))
        else:
            self.selector.unregister(self.listener)
            self.paused_until = time.monotonic() + PAUSE_S

    def _serve_client(self, client: _Client, events: int) -> None:
        try:
            if events & selectors.EVENT_READ:
                self._read(client)
            else:
                self._write(client)
        except OSError:                         # reset, or gone: that client's loss alone
            self._drop(client.sock)

    def _read(self, client: _Client) -> None:
        data = client.sock.recv(HEAD_BYTES + 1 - len(client.head))
        if not data:
            self._drop(client.sock)
            return
        client.head += data
        if client.has_head(len(data)):
            self._reply(client, self._answer(bytes(client.head)))
        elif len(client.head) > HEAD_BYTES:
            self._reply(client, TOO_LARGE)

    def _answer(self, head: bytes) -> bytes:
        try:
            return self.answering.answer(head)
        except Exception:
            log.exception("exporter: answering %r failed", head.split(b"\r\n", 1)[0][:100])
            return FAILED

    def _reply(self, client: _Client, answer: bytes) -> None:
        client.answer = memoryview(answer)
        client.deadline = time.monotonic() + DEADLINE_S
        self.selector.modify(client.sock, selectors.EVENT_WRITE)

    def _write(self, client: _Client) -> None:
        client.answer = client.answer[client.sock.send(client.answer):]
        if not client.answer:
            self._drop(client.sock)

    def _expire(self, now: float) -> None:
        for sock in [s for s, c in self.clients.items() if c.deadline <= now]:
            self._drop(sock)

    def _resume(self) -> None:
        self.paused_until = 0.0
        self.selector.register(self.listener, selectors.EVENT_READ)

    def _drop(self, sock: socket.socket) -> None:
        self.selector.unregister(sock)
        del self.clients[sock]
        sock.close()


class _Client:
    """One connection: the request read so far, then the answer left to send."""

    def __init__(self, sock: socket.socket, deadline: float):
        self.sock, self.deadline = sock, deadline
        self.head = bytearray()
        self.answer = memoryview(b"")

    def has_head(self, new: int) -> bool:
        """The blank line that ends the headers has come (looked for in the new bytes only)."""
        start = max(0, len(self.head) - new - 2)
        return self.head.find(b"\n\r\n", start) >= 0 or self.head.find(b"\n\n", start) >= 0


class _Answer(BaseHTTPRequestHandler):
    """http.server's parsing and answering of one request already read whole
    (the request argument is its bytes); the answer is left in self.out."""

    @classmethod
    def answer(cls, head: bytes) -> bytes:
        # http.server hands the request object to setup() only, which reads it as bytes here.
        return cls(head, ("", 0), None).out.getvalue()      # type: ignore[arg-type]

    def setup(self):
        self.out = io.BytesIO()
        self.rfile, self.wfile = io.BytesIO(self.request), self.out

    def finish(self):
        pass

    def log_message(self, *args):
        pass


def _answering(registry: CollectorRegistry, status: Callable[[], dict]) -> type[_Answer]:
    class Answer(_Answer):
        def do_GET(self):
            if self.path.startswith("/metrics"):
                body, ctype = generate_latest(registry), CONTENT_TYPE_LATEST
            elif self.path.startswith("/status"):
                body, ctype = json.dumps(status()).encode(), "application/json"
            else:
                self.send_error(404, "try /metrics or /status")
                return
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
    return Answer


def listen(address: str, host: str, port: int) -> socket.socket:
    """A listening socket on host:port (an IPv6 literal in brackets or not); OSError
    with one line naming the address, and the port's holder, when it cannot be had."""
    host = host.removeprefix("[").removesuffix("]")
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise OSError(_cannot_listen(address, port, exc)) from None
    sock.setblocking(False)
    return sock


def _cannot_listen(address: str, port: int, exc: OSError) -> str:
    fix = "set daemon.exporter_address to a free HOST:PORT"
    if exc.errno == errno.EADDRINUSE:
        return f"cannot listen on {address}: port {port} is held by {port_holder(port)}; {fix} or stop that process"
    return f"cannot listen on {address} ({exc.strerror}); {fix}"


def port_holder(port: int) -> str:
    """Who listens on TCP port, in words: 'pid 812 (nginx: master process)', or why it cannot be said."""
    try:
        pids = {c.pid for c in psutil.net_connections(kind="tcp")
                if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port}
    except (psutil.Error, OSError) as exc:
        return f"a process that could not be found ({exc})"
    named = sorted(p for p in pids if p)
    if not named:
        return ("a process slotune may not see (run it as root to name the holder)" if pids
                else "a socket whose process could not be found (bound but not listening, or gone)")
    return ", ".join(f"pid {pid} ({_command(pid)})" for pid in named[:3]) + (" and others" if len(named) > 3 else "")


def _command(pid: int) -> str:
    """The process's command line, shortened and inert (it is the holder's to set)."""
    try:
        holder = psutil.Process(pid)
        words = " ".join(holder.cmdline()) or holder.name()
    except psutil.Error:
        return "command unknown"
    return inert(words[:80])
