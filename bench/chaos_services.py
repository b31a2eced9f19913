"""The services bench/chaos.py puts beside the daemon: healthy ones it must keep
tuning (an HTTP server with /metrics and a JSON /admin/config whose latency
follows its rate limit, so the throttle always has a change to make) and hostile
ones, each answering one way a broken or malicious service does. Every server is a
real loopback TCP server; `python -m bench.chaos_services healthy PORT` runs a
healthy one as its own process (the one chaos.py restarts every few seconds), and
flood() holds N idle connections to a port between processes that all listen on it."""
from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BOUNDS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
SLOW_ABOVE_RPS = 600.0     # a healthy service's P99 is over its 100 ms SLO above this rate limit
PER_SCRAPE = 50            # requests a healthy service reports between two scrapes


class Healthy:
    """A service that answers well: P99 0.75 s above SLOW_ABOVE_RPS, 20 ms under it."""

    def __init__(self, port: int = 0):
        self.settings = {"rate_limit_rps": 500.0, "concurrency_limit": 64.0}
        self.counts, self.pushes, self.lock = [0] * (len(BOUNDS) + 1), 0, threading.Lock()
        service = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                body = service.metrics() if self.path.startswith("/metrics") else service.config()
                self._send(body)

            def do_PATCH(self):
                length = min(int(self.headers.get("Content-Length", 0)), 1 << 16)
                change = json.loads(self.rfile.read(length) or b"{}")
                with service.lock:
                    service.settings.update({k: float(v) for k, v in change.items() if k in service.settings})
                    service.pushes += 1
                self._send(service.config())

            def _send(self, body: bytes):
                self.wfile.write(http(200, body))

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def config(self) -> bytes:
        with self.lock:
            return json.dumps(self.settings).encode()

    def metrics(self) -> bytes:
        with self.lock:
            slot = BOUNDS.index(1.0) if self.settings["rate_limit_rps"] > SLOW_ABOVE_RPS else 0
            self.counts[slot] += PER_SCRAPE
            counts = list(self.counts)
        lines, total = ["# TYPE svc_request_duration_seconds histogram"], 0
        for le, n in zip((*BOUNDS, "+Inf"), counts):
            total += n
            lines.append(f'svc_request_duration_seconds_bucket{{le="{le}"}} {total}')
        lines += [f"svc_request_duration_seconds_sum {0.75 * total}", f"svc_request_duration_seconds_count {total}"]
        return ("\n".join(lines) + "\n").encode()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def http(status: int, body: bytes, extra: str = "") -> bytes:
    return f"HTTP/1.1 {status} X\r\nContent-Length: {len(body)}\r\n{extra}Connection: close\r\n\r\n".encode() + body


def _metrics(lines: list[str]) -> bytes:
    return http(200, ("\n".join(lines) + "\n").encode())


def huge_numbers(_path: str) -> bytes:
    """Two histogram series of 1.5e308 requests each: their sum is inf."""
    lines = ["# TYPE svc_request_duration_seconds histogram"]
    for route in ("a", "b"):
        lines += [f'svc_request_duration_seconds_bucket{{route="{route}",le="{le}"}} 1.5e308' for le in (*BOUNDS, "+Inf")]
        lines += [f'svc_request_duration_seconds_sum{{route="{route}"}} 1.5e308',
                  f'svc_request_duration_seconds_count{{route="{route}"}} 1.5e308']
    return _metrics(lines)


def many_labels(_path: str) -> bytes:
    """Lines of 12 000 labels each, ~400 kB in all (quadratic for a backtracking duplicate check)."""
    labels = ",".join(f'l{i}="v"' for i in range(12_000))
    return _metrics(["# TYPE svc_request_duration_seconds histogram"] +
                    [f'svc_request_duration_seconds_bucket{{{labels},le="{le}"}} 1' for le in ("0.1", "1.0", "+Inf")] +
                    [f"svc_request_duration_seconds_sum{{{labels}}} 1", f"svc_request_duration_seconds_count{{{labels}}} 1"])


def deep_json(path: str) -> bytes:
    """Its control answer nests 100 000 deep; its metrics are empty but well formed."""
    return http(200, b"[" * 100_000) if path.startswith("/admin") else _metrics(["# no series yet"])


def oversize(_path: str) -> bytes:
    """5 MiB answers: over every cap the daemon has for a service's answer."""
    return http(200, b"#" * (5 << 20))


def garbage(_path: str) -> bytes:
    return random.Random(7).randbytes(64 << 10)


def redirect(_path: str) -> bytes:
    return http(302, b"", "Location: http://169.254.169.254/latest/meta-data/\r\n")


# path -> the bytes to send at once; the trickling and the silent ones are handled apart
INSTANT = {"huge-numbers": huge_numbers, "many-labels": many_labels, "deep-json": deep_json,
           "oversize": oversize, "garbage": garbage, "redirect": redirect}
SLOW = {"trickle": 1.0, "slow-control": 40.0}   # seconds a byte / seconds before any answer


class Hostile:
    """One misbehaving service on a loopback port: a thread accepts, one per connection answers."""

    def __init__(self, kind: str):
        self.kind, self.stopped = kind, threading.Event()
        self.sock = socket.create_server(("127.0.0.1", 0), backlog=256)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.settimeout(5)
                request = conn.recv(65536)
                path = request.split(b" ", 2)[1].decode(errors="replace") if request.count(b" ") >= 2 else "/"
                if self.kind in INSTANT:
                    conn.sendall(INSTANT[self.kind](path))
                elif self.kind == "trickle":
                    conn.sendall(b"HTTP/1.1 200 X\r\nContent-Length: 4194304\r\n\r\n")
                    for _ in range(4 << 20):
                        if self.stopped.wait(SLOW["trickle"]):
                            return
                        conn.sendall(b"#")
                elif not self.stopped.wait(SLOW["slow-control"]):
                    conn.sendall(http(200, b'{"rate_limit_rps": 500}'))
            except OSError:
                return     # the daemon gave up on it: as it should

    def close(self) -> None:
        self.stopped.set()
        self.sock.close()


PER_PROCESS = 8000          # connections a flood process holds, both ends: 16 000 fds of its 20 000 (root
                            # cannot raise RLIMIT_NOFILE's hard limit here: CAP_SYS_RESOURCE is withheld)


def flood(port: int, n: int) -> list[subprocess.Popen]:
    """Processes that hold n idle connections to port between them, each listening on it
    (SO_REUSEPORT) and connecting to it; returned once all are open."""
    procs = [subprocess.Popen([sys.executable, "-m", "bench.chaos_services", "hold", str(port), str(i),
                               str(min(PER_PROCESS, n - i * PER_PROCESS))], stdout=subprocess.PIPE,
                              cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
             for i in range((n + PER_PROCESS - 1) // PER_PROCESS)]
    for p in procs:
        p.stdout.readline()
    return procs


def hold(port: int, index: int, n: int) -> None:
    """One flood process: n connections from 127.0.0.<2 + index> (its own ephemeral ports)."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    server.bind(("127.0.0.1", port))
    server.listen(4096)
    held: list[socket.socket] = []
    threading.Thread(target=lambda: [held.append(server.accept()[0]) for _ in iter(int, 1)], daemon=True).start()
    for _ in range(n):
        c = socket.socket()
        c.bind((f"127.0.0.{2 + index}", 0))
        c.connect(("127.0.0.1", port))
        held.append(c)
    print("held", flush=True)
    while True:
        time.sleep(3600)


def main(argv: list[str]) -> None:
    if argv[0] == "healthy":
        Healthy(int(argv[1]))
        print("ready", flush=True)
        while True:
            time.sleep(3600)
    elif argv[0] == "hold":
        hold(int(argv[1]), int(argv[2]), int(argv[3]))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main(sys.argv[1:])
