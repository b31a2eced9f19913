"""Real HAProxy, nginx and Redis (Debian's packages) started for a test in its own
folder on free loopback ports, and stopped after: what the actuator tests and
the end-to-end tests push limits into."""
from __future__ import annotations

import contextlib
import grp
import os
import pwd
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from slotune.actuators.nginx import workers as nginx_workers

NGINX = "/usr/sbin/nginx"
HAPROXY = "/usr/sbin/haproxy"


def _wait_port(port: int, proc: subprocess.Popen | None, what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited with status {proc.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not listen on {port} within {timeout:g} s")
        time.sleep(0.05)


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


@contextlib.contextmanager
def listening(argv: list[str], port: int, log: Path, **popen):
    """A server process, until it listens on port; stopped after."""
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, **popen)
    try:
        _wait_port(port, proc, argv[0])
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


@contextlib.contextmanager
def redis(folder: Path):
    """Debian's redis-server on a free port, persisting nothing, its files in folder: yields the port."""
    port, = _free_ports(1)
    with listening(["redis-server", "--port", str(port), "--save", "", "--appendonly", "no", "--dir", str(folder)],
                   port, folder / "redis.log"):
        yield port


def haproxy_stat(sock: str, proxy: str, server: str) -> dict[str, str]:
    """One row of HAProxy's `show stat`, read straight off its socket (independently of the actuator)."""
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
    port: int        # the frontend's
    folder: Path
    metrics_url: str  # its Prometheus exporter, on a frontend of its own

    def stat(self, proxy: str, server: str) -> dict[str, str]:
        return haproxy_stat(self.socket, proxy, server)


@contextlib.contextmanager
def haproxy(folder: Path, backend_port: int, maxconn: int = 64, *, queue_timeout_ms: int = 60_000):
    """HAProxy in front of 127.0.0.1:backend_port: frontend fe_main -> backend be_app, server app
    with `maxconn` (a request that waits longer than queue_timeout_ms for it gets HAProxy's 503),
    an admin stats socket at folder/admin.sock and its
    Prometheus exporter on a frontend of its own (metrics_url)."""
    folder.mkdir(parents=True, exist_ok=True)
    port, stats_port = _free_ports(2)
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
    default_backend be_app
frontend fe_stats
    bind 127.0.0.1:{stats_port}
    http-request use-service prometheus-exporter
backend be_app
    server app 127.0.0.1:{backend_port} maxconn {maxconn}
""")
    proc = subprocess.Popen([HAPROXY, "-W", "-db", "-f", str(folder / "haproxy.cfg")],
                            stdout=open(folder / "haproxy.log", "ab"), stderr=subprocess.STDOUT)
    try:
        _wait_port(port, proc, "haproxy")
        deadline = time.monotonic() + 10
        while not sock.exists():
            assert time.monotonic() < deadline, "haproxy made no stats socket"
            time.sleep(0.05)
        yield Haproxy(proc, str(sock), port, folder, f"http://127.0.0.1:{stats_port}/metrics")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@dataclass
class Nginx:
    master_pid: int
    conf: Path
    include: Path
    port: int
    access_log: Path
    folder: Path

    pid_file: Path

    def workers(self) -> set[int]:
        return set(nginx_workers(self.master_pid))

    def wait_for_old_workers(self, old: set[int], timeout: float = 10.0) -> None:
        """Until the workers of before a reload have finished and exited (they still accept for a moment)."""
        deadline = time.monotonic() + timeout
        while self.workers() & old:
            assert time.monotonic() < deadline, "nginx's old workers did not exit"
            time.sleep(0.05)

    def statuses(self) -> list[int]:
        """The status of every request in the access log so far (its format is just the status)."""
        if not self.access_log.exists():
            return []
        return [int(s) for s in self.access_log.read_text().split()]


def _free_privileged_port() -> int:
    """A free loopback port below 1024 (Linux's ip_unprivileged_port_start), as Debian's nginx listens on 80."""
    for port in range(1023, 511, -1):
        with socket.socket() as s:
            with contextlib.suppress(OSError):
                s.bind(("127.0.0.1", port))
                return port
    raise RuntimeError("no free loopback port below 1024")


def _debian_logs(logs: Path) -> None:
    """nginx's logs as Debian ships them: a root:adm 0755 folder, the files www-data:adm 0640."""
    logs.mkdir(exist_ok=True)
    os.chown(logs, 0, grp.getgrnam("adm").gr_gid)
    for name in ("access.log", "error.log"):
        (logs / name).touch()
        os.chown(logs / name, pwd.getpwnam("www-data").pw_uid, grp.getgrnam("adm").gr_gid)
        (logs / name).chmod(0o640)


@contextlib.contextmanager
def nginx(folder: Path, include_text: str, *, delay_s: float = 0.2, debian: bool = False):
    """nginx (with Debian's echo module) on a free port: location /slow answers after `delay_s`
    (echo_sleep), /nginx_status is stub_status; `include` is included at server level, so
    its limit_conn applies there. Its workers run as nobody when started by root; everything
    else is in folder. debian (root only): its files apart as Debian's package has them, each
    in a folder of its own under folder: the include in conf.d/, the logs in log/ (www-data:adm
    0640), the pid file in run/; and a second listen on a free port below 1024, like Debian's 80."""
    folder.mkdir(parents=True, exist_ok=True)
    port, = _free_ports(1)
    conf_d, logs, run = (folder / "conf.d", folder / "log", folder / "run") if debian else (folder,) * 3
    if debian:
        conf_d.mkdir(exist_ok=True)
        run.mkdir(exist_ok=True)
        _debian_logs(logs)
    include, conf, access = conf_d / "slotune-limits.conf", folder / "nginx.conf", logs / "access.log"
    include.write_text(include_text)
    include.chmod(0o640)
    user = "user nobody nogroup;" if os.geteuid() == 0 else ""
    privileged = f"listen 127.0.0.1:{_free_privileged_port()};" if debian else ""
    conf.write_text(f"""load_module /usr/share/nginx/modules/ngx_http_echo_module.so;
{user}
worker_processes 1;
pid {run}/nginx.pid;
error_log {logs}/error.log;
events {{ worker_connections 256; }}
http {{
    log_format status '$status';
    access_log {access} status;
    client_body_temp_path {folder}/body;
    proxy_temp_path {folder}/proxy;
    fastcgi_temp_path {folder}/fastcgi;
    uwsgi_temp_path {folder}/uwsgi;
    scgi_temp_path {folder}/scgi;
    limit_conn_zone $server_port zone=perserver:1m;
    limit_conn_status 503;
    server {{
        listen 127.0.0.1:{port};
        {privileged}
        include {include};
        location /slow {{ echo_sleep {delay_s}; echo done; }}
        location /nginx_status {{ stub_status; }}
    }}
}}
""")
    subprocess.run([NGINX, "-c", str(conf), "-p", str(folder)], check=True, capture_output=True, timeout=20)
    pid_file = run / "nginx.pid"
    try:
        deadline = time.monotonic() + 10
        while not pid_file.exists():
            assert time.monotonic() < deadline, "nginx wrote no pid file"
            time.sleep(0.05)
        _wait_port(port, None, "nginx")
        ng = Nginx(int(pid_file.read_text()), conf, include, port, access, folder, pid_file)
        while not ng.workers():     # the master listens and writes its pid file before it forks one
            assert time.monotonic() < deadline, "nginx's master started no worker"
            time.sleep(0.01)
        yield ng
    finally:
        with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError):
            pid = int(pid_file.read_text())
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                os.kill(pid, 0)       # ProcessLookupError once it is gone
                time.sleep(0.05)
