"""HTTP for a root daemon that trusts no server: one exchange, whole (connecting,
status line, headers, body) by one deadline, a cap on the answer's size, no
redirect followed and no proxy used (http.client does neither). Used to push
settings and to read services' /metrics.

A GET's connection is kept for the next GET to the same place, as Prometheus
keeps its scrape connections open: at a scrape a second, a new connection took
0.63-0.66 ms of the daemon's CPU an exchange, a kept one 0.49 (docs/overhead.md).
Only a connection whose answer was read whole and that the server did not close
is kept, one per place, and only while idle and silent: one the server closed,
or that has bytes nobody asked for, is dropped before use, and a GET that finds
its kept connection closed under it is sent once more on a new one, by the same
deadline. Anything else (a push, a failure, an answer over the cap) closes it."""
from __future__ import annotations

import http.client
import io
import select
import threading
import time
from typing import Any
from urllib.parse import urlsplit

KEPT_IDLE_S = 30.0      # a kept connection unused this long is closed


class TooLarge(OSError):
    """The answer is larger than the cap."""


Place = tuple[str, str, int | None]      # scheme, host, port: connections are kept per place
_kept: dict[Place, tuple["_Deadline", float]] = {}   # place -> an idle connection, when it went idle
_kept_lock = threading.Lock()
_DROPPED = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)   # a kept one closed under us


def exchange(url: str, method: str = "GET", body: bytes | None = None, headers: dict | None = None, *,
             timeout_s: float, max_bytes: int) -> tuple[int, str, bytes]:
    """(status, Location header, body) of one request to url; TimeoutError past the deadline,
    TooLarge over max_bytes, OSError when it cannot connect."""
    deadline = time.monotonic() + timeout_s
    parts = urlsplit(url)
    place: Place = (parts.scheme, parts.hostname or "", parts.port)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    conn = _take(place, deadline) if method == "GET" else None
    if conn is not None:
        try:
            return _exchange(conn, place, method, target, body, headers, max_bytes)
        except _DROPPED:
            pass      # closed by the server as we sent: once more on a new connection
    connection = _HTTPS if parts.scheme == "https" else _HTTP
    conn = connection(parts.hostname, parts.port, timeout=max(deadline - time.monotonic(), 1e-3), deadline=deadline)
    return _exchange(conn, place, method, target, body, headers, max_bytes)


def _exchange(conn, place: Place, method: str, target: str, body, headers, max_bytes: int):
    kept = False
    try:
        conn.request(method, target, body, headers or {})
        answer = conn.getresponse()
        if (answer.length or 0) > max_bytes:
            raise TooLarge(f"over {max_bytes} bytes")
        chunks, size = [], 0
        while chunk := answer.read1(64 * 1024):
            size += len(chunk)
            if size > max_bytes:
                raise TooLarge(f"over {max_bytes} bytes")
            chunks.append(chunk)
        if answer.length:      # the server closed before Content-Length's bytes came: not an answer
            raise http.client.IncompleteRead(b"".join(chunks), answer.length)
        kept = method == "GET" and not answer.will_close and (answer.length == 0 or answer.isclosed())
        answer.close()       # read whole: the connection may carry the next request
        return answer.status, answer.getheader("Location", ""), b"".join(chunks)
    finally:
        if kept:
            _keep(place, conn)
        else:
            conn.close()


def _take(place: Place, deadline: float):
    """The place's kept connection, if it is still open and silent, on the new deadline; else None."""
    with _kept_lock:
        conn, _ = _kept.pop(place, (None, 0.0))
    if conn is None:
        return None
    if conn.sock is None or _stirred(conn.sock.sock):
        conn.close()
        return None
    conn.renew(deadline)
    return conn


def _stirred(sock) -> bool:
    """Whether an idle connection has anything to read: closed by the server (EOF, a reset),
    or bytes nobody asked for (in the socket, or already decrypted by TLS)."""
    poll = select.poll()
    poll.register(sock, select.POLLIN)
    return bool(poll.poll(0)) or bool(getattr(sock, "pending", lambda: 0)())


def _keep(place: Place, conn) -> None:
    """Keep conn for the place's next GET; closes what is not kept: a second one for the
    place, and any kept connection idle longer than KEPT_IDLE_S."""
    now = time.monotonic()
    with _kept_lock:
        stale = [p for p, (_, since) in _kept.items() if now - since > KEPT_IDLE_S]
        closing = [_kept.pop(p)[0] for p in stale]
        if place in _kept:
            closing.append(conn)
        else:
            _kept[place] = (conn, now)
    for c in closing:
        c.close()


class _Reads(io.RawIOBase):
    """The answer's bytes off a socket, each read waiting only for what is left until the deadline."""

    def __init__(self, sock, deadline: float):
        self.sock, self.deadline = sock, deadline
        self.raw = sock.makefile("rb", buffering=0)     # keeps the socket open while the answer is read

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the deadline passed")
        self.sock.settimeout(left)
        return self.raw.readinto(buffer)

    def close(self) -> None:
        self.raw.close()
        super().close()


class _DeadlineSocket:
    """A connected socket whose answer (status line, headers, body) must arrive by one deadline."""

    def __init__(self, sock, deadline: float):
        self.sock, self.deadline = sock, deadline

    def makefile(self, mode: str):
        return io.BufferedReader(_Reads(self.sock, self.deadline))

    def __getattr__(self, name: str):
        return getattr(self.sock, name)


class _Deadline(http.client.HTTPConnection):
    """An http.client connection (which follows no redirect and reads no proxy settings) on a deadline;
    _HTTPS puts it before HTTPSConnection, whose connect() its own calls."""
    sock: Any     # a _DeadlineSocket once connected

    def __init__(self, *args, deadline: float, **kwargs):
        super().__init__(*args, **kwargs)
        self.deadline = deadline

    def connect(self) -> None:
        super().connect()
        self.sock = _DeadlineSocket(self.sock, self.deadline)

    def renew(self, deadline: float) -> None:
        """A kept connection's next exchange: by this deadline (sending included)."""
        self.deadline = self.sock.deadline = deadline
        self.sock.settimeout(max(deadline - time.monotonic(), 1e-3))


class _HTTP(_Deadline):
    pass


class _HTTPS(_Deadline, http.client.HTTPSConnection):
    pass
