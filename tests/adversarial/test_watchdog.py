"""The systemd watchdog under a hanging service: WATCHDOG_USEC=2s, windows of
5 s (longer than the watchdog) and a metrics_url that accepts and never answers. The real daemon must keep pinging
well inside the 2 s (it pings from its wait, and every HTTP read has one
deadline), or systemd would kill it every cycle."""
import os
import socket
import subprocess
import sys
import time

import pytest

from reference_stack import launcher
from tests.adversarial.conftest import Scripted
from tests.conftest import ROOT

pytestmark = pytest.mark.slow


def hang(conn, _request, stopped):
    stopped.wait(60)


def test_a_hanging_metrics_url_under_a_2_s_watchdog(tmp_path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "notify"))
    server = Scripted(hang)
    port = launcher.free_ports(1)[0]
    conf = tmp_path / "slotune.toml"
    conf.write_text(f"""[daemon]
collect_interval_s = 5.0
exporter_address = "127.0.0.1:{port}"
baseline_store = "{tmp_path}/baselines.sqlite"
audit_log = "{tmp_path}/audit.jsonl"
state_file = "{tmp_path}/state.json"
probes = []
[services.api]
port = {server.port}
slo_p99_ms = 100
metrics_url = "http://127.0.0.1:{server.port}/metrics"
""")
    env = dict(os.environ, NOTIFY_SOCKET=str(tmp_path / "notify"), WATCHDOG_USEC="2000000")
    env.pop("WATCHDOG_PID", None)
    log = tmp_path / "daemon.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "slotune.cli", "run", "--config", str(conf)], cwd=ROOT,
                                stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        sock.settimeout(60)
        while sock.recv(4096) != b"READY=1":
            assert proc.poll() is None, log.read_text()
        sock.settimeout(5)
        pings, last, longest = 0, time.monotonic(), 0.0
        while pings < 8:
            if sock.recv(4096) == b"WATCHDOG=1":
                now = time.monotonic()
                longest, last, pings = max(longest, now - last), now, pings + 1
        assert longest < 1.8, f"{longest:.2f} s between two watchdog pings (the watchdog is 2 s)"
        assert proc.poll() is None
        assert "no sample from it" in log.read_text()     # the hang is said, and the daemon goes on
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)     # a daemon deaf to SIGTERM fails here (tests/test_daemon_signals.py)
        finally:
            proc.kill()               # ... and does not outlive the test
            server.close()
            sock.close()
