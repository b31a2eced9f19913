"""A daemon (daemon.process.Daemon, in this process) whose decisions are real: a throttle
tuner pushing rate_limit_rps through the real file actuator, on windows from a stand-in
collector whose latency the test sets; and an HTTP listener for the stand-ins of
Grafana and an OTel Collector, which cannot be installed here."""
from __future__ import annotations

import json
import textwrap
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from slotune import config
from slotune.model.histogram import Histogram
from slotune.model.sample import Sample
from slotune.model.window import EBPF_LATENCY
from slotune.process import Daemon
from tests.conftest import StandInCollector

SLO_MS = 200
TOKEN = "glsa_standin_token_0123456789"


class SetLatency(StandInCollector):
    """A stand-in collector: 100 requests a window, 2 % of them at p99_s, the rest at 20 ms."""
    name, exports_samples = "standin", True

    def __init__(self):
        self.p99_s = 0.05

    def collect(self, start, end):
        values = np.r_[np.full(98, 20e6), np.full(2, self.p99_s * 1e9)]
        return [Sample("api", self.name, start, end, histograms={EBPF_LATENCY: Histogram.from_values(values)})]


@pytest.fixture
def make_daemon(tmp_path):
    """make_daemon(export_toml) -> (Daemon, SetLatency); rate_limit_rps starts at 100."""
    made = []

    def make(export: str) -> tuple[Daemon, SetLatency]:
        (tmp_path / "settings.json").write_text(json.dumps({"rate_limit_rps": 100.0}))
        token = tmp_path / "grafana.token"
        token.write_text(TOKEN + "\n")
        token.chmod(0o600)
        (tmp_path / "slotune.toml").write_text(textwrap.dedent(f"""
            [daemon]
            exporter_address = "127.0.0.1:0"
            baseline_store = "{tmp_path}/baselines.sqlite"
            audit_log = "{tmp_path}/audit.jsonl"
            environment = "export-test"
            [services.api]
            cmdline = "api"
            slo_p99_ms = {SLO_MS}
            [services.api.control]
            kind = "file"
            path = "{tmp_path}/settings.json"
            [services.api.tuners.throttle]
            policy = "whitepaper"
            interval_s = 1.0
            [services.api.settings.rate_limit_rps]
            min = 10
            max = 1000
            max_step = 50
            """) + textwrap.dedent(export).replace("TOKEN_FILE", str(token)))
        latency = SetLatency()
        daemon = Daemon(config.load(tmp_path / "slotune.toml"), collectors=[latency])
        made.append(daemon)
        return daemon, latency
    yield make
    for d in made:
        d.close()


def steps(daemon: Daemon, clock: list[float], n: int) -> list:
    """n one-second intervals from clock[0]; every entry the control loop wrote."""
    entries = []
    for _ in range(n):
        before = len(daemon.audit.recent)
        daemon.step(clock[0], clock[0] + 1.0)
        clock[0] += 1.0
        entries += list(daemon.audit.recent)[before:]
    return entries


def wait_for(predicate, what: str, timeout_s: float = 10.0):
    deadline = time.monotonic() + timeout_s
    while not (got := predicate()):
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:.0f} s"
        time.sleep(0.05)
    return got


def metric_value(daemon: Daemon, name: str, **labels) -> float:
    return daemon.registry.get_sample_value(name, labels) or 0.0


class Listener:
    """An HTTP server on loopback whose answer(method, path, headers, body) -> (status, headers, body)
    the stand-in supplies; every request kept as (method, path, headers, body)."""

    def __init__(self, answer):
        self.requests: list[tuple[str, str, dict, bytes]] = []
        listener = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def handle_any(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                listener.requests.append((self.command, self.path, dict(self.headers), body))
                status, headers, out = answer(self.command, self.path, self.headers, body)
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)
            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = handle_any

            def log_message(self, *args):
                pass
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
