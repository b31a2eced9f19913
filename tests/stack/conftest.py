"""One real reference stack (separate processes, real Redis, free loopback
ports) shared by the stack tests, started with the launcher `up` uses and
stopped, every process, at the end."""
from __future__ import annotations

import json
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from reference_stack import launcher


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
        assert status == 200, body
        return body["settings"]

    def patch(self, service: str, **changes) -> dict:
        status, body = self.admin(service, "PATCH", changes)
        assert status == 200, body
        return body["settings"]

    def query(self, text: str) -> tuple[int, dict]:
        return self.http("POST", self.state["query_url"], {"query": text})

    def concurrently(self, fn, args: list) -> list:
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


@pytest.fixture(scope="session")
def stack(tmp_path_factory):
    ports = launcher.free_ports(8)
    cfg = launcher.StackConfig(
        run_dir=tmp_path_factory.mktemp("stack"), gateway_port=ports[0], inference_port=ports[1],
        sidecar_port=ports[2], sidecar_admin_port=ports[3], redis_port=ports[4],
        tool_ports={"search": ports[5], "calculator": ports[6], "weather": ports[7]},
        # Small and quick for tests; a short breaker cooldown so a test can wait it out.
        inference_args=["--device", "cpu", "--d-model", "64", "--layers", "2", "--heads", "4",
                        "--max-new-tokens", "4"],
        gateway_args=["--breaker-cooldown-s", "1"])
    state = launcher.start(cfg)
    try:
        yield StackClient(state)
    finally:
        launcher.stop(cfg.run_dir)
