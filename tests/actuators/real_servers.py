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

from reference_stack.engine import proxy
from reference_stack.engine.proxy import show_stat, wait_port
from reference_stack.launcher import free_ports
from slotune.actuators.nginx import workers as nginx_workers

NGINX = "/usr/sbin/nginx"


@contextlib.contextmanager
def listening(argv: list[str], port: int, log: Path, **popen):
    """A server process, until it listens on port; stopped after."""
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, **popen)
    try:
        wait_port(port, proc, argv[0])
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


@contextlib.contextmanager
def redis(folder: Path):
    """Debian's redis-server on a free port, persisting nothing, its files in folder: yields the port."""
    port, = free_ports(1)
    with listening(["redis-server", "--port", str(port), "--save", "", "--appendonly", "no", "--dir", str(folder)],
                   port, folder / "redis.log"):
        yield port


def haproxy_stat(sock: str, proxy: str, server: str) -> dict[str, str]:
    """One row of HAProxy's `show stat`, read straight off its socket (independently of the actuator)."""
    return show_stat(sock, proxy, server)


@contextlib.contextmanager
def haproxy(folder: Path, backend_port: int, maxconn: int = 64, *, queue_timeout_ms: int = 60_000):
    """The reference stack's HAProxy (reference_stack/engine/proxy.py) in front of
    127.0.0.1:backend_port: frontend fe_main -> backend be_app, server app with `maxconn`
    (a request that waits longer than queue_timeout_ms for it gets HAProxy's 503)."""
    with proxy.haproxy(folder, backend_port, maxconn, queue_timeout_ms=queue_timeout_ms, backend="be_app",
                       server="app") as h:
        yield h


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
    port, = free_ports(1)
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
        wait_port(port, None, "nginx")
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
