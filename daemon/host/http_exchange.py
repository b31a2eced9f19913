"""HTTP for a root daemon that trusts no server: one exchange, whole (connecting,
status line, headers, body) by one deadline, a cap on the answer's size, no
redirect followed and no proxy used (http.client does neither). Used to push
settings and to read services' /metrics."""
from __future__ import annotations

import http.client
import io
import time
from urllib.parse import urlsplit


class TooLarge(OSError):
    """The answer is larger than the cap."""


def exchange(url: str, method: str = "GET", body: bytes | None = None, headers: dict | None = None, *,
             timeout_s: float, max_bytes: int) -> tuple[int, str, bytes]:
    """(status, Location header, body) of one request to url; TimeoutError past the deadline,
    TooLarge over max_bytes, OSError when it cannot connect."""
    deadline = time.monotonic() + timeout_s
    parts = urlsplit(url)
    connection = _HTTPS if parts.scheme == "https" else _HTTP
    conn = connection(parts.hostname, parts.port, timeout=timeout_s, deadline=deadline)
    try:
        conn.request(method, (parts.path or "/") + (f"?{parts.query}" if parts.query else ""), body,
                     headers or {})
        answer = conn.getresponse()
        if (answer.length or 0) > max_bytes:
            raise TooLarge(f"over {max_bytes} bytes")
        chunks, size = [], 0
        while chunk := answer.read1(64 * 1024):
            size += len(chunk)
            if size > max_bytes:
                raise TooLarge(f"over {max_bytes} bytes")
            chunks.append(chunk)
        return answer.status, answer.getheader("Location", ""), b"".join(chunks)
    finally:
        conn.close()


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


class _Deadline:
    """An http.client connection (which follows no redirect and reads no proxy settings) on a deadline."""

    def __init__(self, *args, deadline: float, **kwargs):
        super().__init__(*args, **kwargs)
        self.deadline = deadline

    def connect(self) -> None:
        super().connect()
        self.sock = _DeadlineSocket(self.sock, self.deadline)


class _HTTP(_Deadline, http.client.HTTPConnection):
    pass


class _HTTPS(_Deadline, http.client.HTTPSConnection):
    pass
