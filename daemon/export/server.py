"""The daemon's HTTP endpoint: /metrics (Prometheus exposition of its registry)
and /status (the JSON view `slotune status` reads), on a thread of its own."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest


class MetricsServer:
    def __init__(self, address: str, host_port: tuple[str, int], registry: CollectorRegistry,
                 status: Callable[[], dict]):
        class Handler(BaseHTTPRequestHandler):
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

            def log_message(self, *args):
                pass

        try:
            self.httpd = ThreadingHTTPServer(host_port, Handler)
        except OSError as exc:
            raise OSError(f"cannot listen on {address} ({exc.strerror}); "
                          "set daemon.exporter_address to a free HOST:PORT") from None
        threading.Thread(target=self.httpd.serve_forever, name="exporter", daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
