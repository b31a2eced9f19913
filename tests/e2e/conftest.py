"""The real daemon (`slotune run`, its own process) against a real reference
stack: a config writer, a running-daemon handle, and the stack fixture."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from slotune.demo.stack_config import for_reference_stack
from reference_stack import launcher
from reference_stack.client import StackClient
from reference_stack.paced import Pace
from tests.conftest import ROOT


def daemon_config(state: dict, exporter_port: int, work: Path, *, gateway_slo_ms=600, inference_slo_ms=500,
                  gateway_tuners="", inference_tuners="", control_url: str = "") -> str:
    """The reference-stack config with only the tuners a test asks for."""
    return for_reference_stack(state, exporter_port, work, gateway_slo_ms=gateway_slo_ms,
                               inference_slo_ms=inference_slo_ms, gateway_tuners=gateway_tuners,
                               inference_tuners=inference_tuners, gateway_control_url=control_url,
                               environment="test")


# Paced capacity (reference_stack/paced.py): the stack's inference server times its batches by a
# clock, so a load step at a multiple of PACE.capacity() is that multiple on any host, busy or
# quiet. Answers are 12 tokens (ANSWER_TOKENS, the model's default), degraded ones fewer.
PACE = Pace.parse(launcher.PACED[1])
ANSWER_TOKENS = 12


def daemon_table(exporter_port: int, work: Path, probes: tuple[str, ...]) -> str:
    """The [daemon] table of a test's own config: its files in work, only these probe families."""
    return f"""[daemon]
collect_interval_s = 1.0
exporter_address = "127.0.0.1:{exporter_port}"
baseline_store = "{work}/baselines.sqlite"
audit_log = "{work}/audit.jsonl"
environment = "test"
probes = {json.dumps(list(probes))}
"""


@dataclass
class RunningDaemon:
    proc: subprocess.Popen
    url: str
    work: Path

    def status(self) -> dict:
        with urllib.request.urlopen(self.url + "/status", timeout=3) as resp:
            return json.loads(resp.read())

    def metrics(self) -> str:
        with urllib.request.urlopen(self.url + "/metrics", timeout=3) as resp:
            return resp.read().decode()

    def audit(self) -> list[dict]:
        path = self.work / "audit.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def log(self) -> str:
        return (self.work / "daemon.log").read_text()

    def stop(self, sig=signal.SIGTERM, timeout=20) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout=timeout)


def start_daemon(config_text: str, work: Path, exporter_port: int, *extra) -> RunningDaemon:
    work.mkdir(parents=True, exist_ok=True)
    (work / "slotune.toml").write_text(config_text)
    log = open(work / "daemon.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "slotune.cli", "run", "--config", str(work / "slotune.toml"), *extra],
                            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    log.close()
    d = RunningDaemon(proc, f"http://127.0.0.1:{exporter_port}", work)
    deadline = time.monotonic() + 60
    while True:
        try:
            d.status()
            return d
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"slotune run did not come up; its log:\n{d.log()[-3000:]}")
            time.sleep(0.3)


@pytest.fixture
def daemon_factory(tmp_path):
    started: list[RunningDaemon] = []

    def make(config_for, *extra, name="daemon") -> RunningDaemon:
        """config_for(exporter_port, work_dir) -> TOML text."""
        port, work = launcher.free_ports(1)[0], tmp_path / name
        d = start_daemon(config_for(port, work), work, port, *extra)
        started.append(d)
        return d
    yield make
    for d in started:
        if d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """Paced capacity (PACE), batch 1 to start with."""
    cfg = launcher.StackConfig.on_free_ports(
        tmp_path_factory.mktemp("e2e-stack"), inference_args=launcher.PACED,
        settings={"inference": {"max_batch_size": 1}, "gateway": {"concurrency_limit": 64}})
    state = launcher.start(cfg)
    try:
        yield StackClient(state)
    finally:
        launcher.stop(cfg.run_dir)


@pytest.fixture
def fresh_settings(stack):
    """Each test starts from the same settings and leaves them so."""
    initial = {"gateway": stack.settings("gateway"), "inference": stack.settings("inference")}
    yield initial
    stack.patch("gateway", concurrency_limit=64, blocking_io_ms=0)
    stack.patch("inference", max_batch_size=1, max_queue_delay_ms=initial["inference"]["max_queue_delay_ms"])

