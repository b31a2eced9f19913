"""Debian's HAProxy in front of one server, the way people put one before an engine:
frontend fe_main on a free loopback port -> backend (be_vllm by default) -> one server
with a `maxconn` (its admission limit, which slotune's throttle pushes through the
runtime API); a request that waits longer than queue_timeout_ms for a free slot gets
HAProxy's 503 at once instead of a late answer. An admin stats socket in the folder,
and HAProxy's Prometheus exporter on a frontend of its own (metrics_url)."""
from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from reference_stack.launcher import free_ports

HAPROXY = "/usr/sbin/haproxy"


def wait_port(port: int, proc: subprocess.Popen | None, what: str, timeout: float = 15.0) -> None:
    """Until something accepts on 127.0.0.1:port; RuntimeError if proc exits or the time runs out."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited with status {proc.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not listen on {port} within {timeout:g} s")
        time.sleep(0.05)


def show_stat(sock: str, proxy: str, server: str) -> dict[str, str]:
    """One row of HAProxy's `show stat`, read straight off its socket (not through slotune)."""
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(sock)
        s.sendall(b"show stat\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    lines = data.decode().splitlines()
    header = lines[0].removeprefix("# ").split(",")
    for line in lines[1:]:
        row = line.split(",")
        if row[:2] == [proxy, server]:
            return dict(zip(header, row))
    raise KeyError(f"{proxy}/{server} not in show stat")


@dataclass
class Haproxy:
    proc: subprocess.Popen
    socket: str
    port: int         # the frontend's
    folder: Path
    metrics_url: str  # its Prometheus exporter, on a frontend of its own
    backend: str
    server: str

    def stat(self, proxy: str | None = None, server: str | None = None) -> dict[str, str]:
        return show_stat(self.socket, proxy or self.backend, server or self.server)

    @property
    def target(self) -> str:
        """The runtime-API target of the server's maxconn, as [control.targets] names it."""
        return f"maxconn server {self.backend}/{self.server}"


@contextlib.contextmanager
def haproxy(folder: Path, backend_port: int, maxconn: int = 64, *, queue_timeout_ms: int = 60_000,
            backend: str = "be_vllm", server: str = "vllm1"):
    """HAProxy in front of 127.0.0.1:backend_port until the block ends: yields a Haproxy."""
    folder.mkdir(parents=True, exist_ok=True)
    port, stats_port = free_ports(2)
    sock = folder / "admin.sock"
    (folder / "haproxy.cfg").write_text(f"""global
    stats socket {sock} mode 600 level admin
    maxconn 2000
defaults
    mode http
    timeout connect 2s
    timeout client 60s
    timeout server 60s
    timeout queue {queue_timeout_ms}ms
frontend fe_main
    bind 127.0.0.1:{port}
    maxconn 1000
    default_backend {backend}
frontend fe_stats
    bind 127.0.0.1:{stats_port}
    http-request use-service prometheus-exporter
backend {backend}
    server {server} 127.0.0.1:{backend_port} maxconn {maxconn}
""")
    with open(folder / "haproxy.log", "ab") as log:
        proc = subprocess.Popen([HAPROXY, "-W", "-db", "-f", str(folder / "haproxy.cfg")], stdout=log,
                                stderr=subprocess.STDOUT)
    try:
        wait_port(port, proc, "haproxy")
        deadline = time.monotonic() + 10
        while not sock.exists():
            if time.monotonic() > deadline:
                raise RuntimeError("haproxy made no stats socket")
            time.sleep(0.05)
        yield Haproxy(proc, str(sock), port, folder, f"http://127.0.0.1:{stats_port}/metrics", backend, server)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
