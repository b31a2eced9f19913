"""A small synchronous client for a running stack (from its state dict, as
`launcher.start` returns or <run dir>/state.json holds): queries, the control
API, /metrics samples and logs. Tests, benches and demos use it."""
from __future__ import annotations

import json
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families


class StackClient:
    """HTTP to the running stack, the way the daemon's actuators and users reach it."""

    def __init__(self, state: dict):
        self.state = state
        self.urls = state["urls"]
        self.run_dir = Path(state["run_dir"])
        self.token = Path(state["token_file"]).read_text().strip()

    def http(self, method: str, url: str, body=None, headers=None) -> tuple[int, dict]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def admin(self, service: str, method: str = "GET", body=None, token: str | None = None,
              path: str = "/admin/config") -> tuple[int, dict]:
        token = self.token if token is None else token
        return self.http(method, self.urls[service] + path, body, {"Authorization": f"Bearer {token}"})

    def settings(self, service: str) -> dict:
        status, body = self.admin(service)
        if status != 200:
            raise RuntimeError(f"GET {service} /admin/config answered {status}: {body}")
        return body["settings"]

    def patch(self, service: str, **changes) -> dict:
        status, body = self.admin(service, "PATCH", changes)
        if status != 200:
            raise RuntimeError(f"PATCH {service} /admin/config {changes} answered {status}: {body}")
        return body["settings"]

    def query(self, text: str) -> tuple[int, dict]:
        return self.http("POST", self.state["query_url"], {"query": text})

    @staticmethod
    def concurrently(fn, args: list) -> list:
        """fn over args, all at once (one thread each)."""
        with ThreadPoolExecutor(max_workers=len(args)) as pool:
            return list(pool.map(fn, args))

    def metric(self, service: str, name: str, **labels) -> float:
        """The sample's value on the service's /metrics (0 when absent)."""
        with urllib.request.urlopen(self.urls[service] + "/metrics", timeout=10) as r:
            text = r.read().decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                    return sample.value
        return 0.0

    def log(self, service: str) -> str:
        return (self.run_dir / f"{service}.log").read_text(errors="replace")
