"""A service the adversarial daemon tests can script: a real HTTP server on a
free loopback port whose /metrics reports every request as slow (so a throttle
tuner always wants a change) and whose /admin/config is a plain JSON control
surface that records every change pushed to it."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BOUNDS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class ServiceDouble:
    """Each scrape adds `per_scrape` requests of about 0.75 s (the le=1.0 bucket)."""

    def __init__(self, settings: dict[str, float], per_scrape: int = 50):
        self.settings, self.per_scrape = dict(settings), per_scrape
        self.scrapes, self.pushes, self.refused = 0, [], []
        self.push_status = lambda n: 200     # n-th PATCH (from 0) -> status; not 200: refused, nothing applied
        self.lock = threading.Lock()
        double = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path.startswith("/metrics"):
                    self._send(double.metrics().encode(), "text/plain; version=0.0.4")
                else:
                    with double.lock:
                        self._send(json.dumps(double.settings).encode(), "application/json")

            def do_PATCH(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                with double.lock:
                    status = double.push_status(len(double.pushes) + len(double.refused))
                    if status != 200:
                        double.refused.append(body)
                        self._send(b'{"error": "refused on purpose"}', "application/json", status)
                        return
                    double.settings.update(body)
                    double.pushes.append(body)
                    self._send(json.dumps(double.settings).encode(), "application/json")

            def _send(self, body: bytes, ctype: str, status: int = 200):
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def metrics(self) -> str:
        with self.lock:
            self.scrapes += 1
            n = self.scrapes * self.per_scrape
        lines = ["# TYPE svc_request_duration_seconds histogram"]
        for le in BOUNDS:
            lines.append(f'svc_request_duration_seconds_bucket{{le="{le}"}} {n if le >= 1.0 else 0}')
        lines += [f'svc_request_duration_seconds_bucket{{le="+Inf"}} {n}',
                  f"svc_request_duration_seconds_sum {0.75 * n}", f"svc_request_duration_seconds_count {n}"]
        return "\n".join(lines) + "\n"

    def pushed(self) -> int:
        with self.lock:
            return len(self.pushes)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def config(double: ServiceDouble, exporter_port: int, work, *, policy="whitepaper", dry_run=False,
           extra_daemon="", extra_service="") -> str:
    """A daemon config watching the double with a throttle tuner deciding every second."""
    return f"""
[daemon]
collect_interval_s = 0.5
exporter_address = "127.0.0.1:{exporter_port}"
baseline_store = "{work}/baselines.sqlite"
audit_log = "{work}/audit.jsonl"
environment = "test"
dry_run = {"true" if dry_run else "false"}
probes = []
{extra_daemon}
[services.svc]
port = {double.port}
slo_p99_ms = 100
metrics_url = "http://127.0.0.1:{double.port}/metrics"
latency_metric = "svc_request_duration_seconds"
{extra_service}
[services.svc.control]
kind = "http-json"
url = "http://127.0.0.1:{double.port}/admin/config"

[services.svc.tuners.throttle]
policy = "{policy}"
interval_s = 1.0

[services.svc.settings.rate_limit_rps]
min = 1.0
max = 1000.0
max_step = 50.0

[services.svc.settings.concurrency_limit]
min = 1.0
max = 256.0
max_step = 16.0
integer = true
"""
