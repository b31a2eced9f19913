"""Live: the real daemon (`slotune run`, real BPF) watches the real reference
stack under load; after a calm baseline the gateway blocks its event loop in
syscalls, and `slotune attribute gateway` must name blocking syscalls, with the
share exported on /metrics."""
import json
import os
import subprocess
import sys
import time

import pytest

from slotune.attribution.explain import DOMINANT_SHARE
from reference_stack import launcher
from reference_stack.client import StackClient
from tests.conftest import ROOT, run_slotune
from tests.e2e.conftest import start_daemon

pytestmark = [pytest.mark.slow, pytest.mark.kernel]

CALM_S = 20          # baseline: at least 5 spans of 2 s with requests
WAIT_S = 25          # longest wait for the verdict once the fault is on


def config(stack: dict, port: int, work) -> str:
    p = stack["ports"]
    return f"""
[daemon]
exporter_address = "127.0.0.1:{port}"
baseline_store = "{work}/baselines.sqlite"
audit_log = "{work}/audit.jsonl"
dry_run = true

[services.gateway]
cmdline = "reference_stack gateway .*--run-dir {stack['run_dir']}( |$)"
metrics_url = "http://127.0.0.1:{p['gateway']}/metrics"
latency_metric = "gateway_request_duration_seconds"
downstream = ["inference"]

[services.inference]
cmdline = "reference_stack inference .*--run-dir {stack['run_dir']}( |$)"
metrics_url = "http://127.0.0.1:{p['inference']}/metrics"
latency_metric = "inference_request_duration_seconds"
"""


@pytest.fixture(scope="module")
def watched(tmp_path_factory):
    """One stack and daemon for the module: the refusal test reads it before the fault is on."""
    if os.geteuid() != 0:
        pytest.fail("this test needs root (make test runs as root)")
    tmp_path = tmp_path_factory.mktemp("attribute-live")
    # Paced capacity (reference_stack/paced.py): at the default batch of 8 the inference server
    # serves 74 answers/s on any host, so the 20 queries/s here are calm by construction.
    cfg = launcher.StackConfig.on_free_ports(tmp_path / "stack", inference_args=launcher.PACED)
    state = launcher.start(cfg)
    daemon = load = None
    try:
        port = launcher.free_ports(1)[0]
        daemon = start_daemon(config(state | {"ports": {"gateway": cfg.gateway_port,
                                                        "inference": cfg.inference_port}}, port, tmp_path),
                              tmp_path / "daemon", port)
        load = subprocess.Popen([sys.executable, "-m", "reference_stack", "load", "--url", state["query_url"],
                                 "--rate", "20", "--duration", str(CALM_S + WAIT_S + 30)], cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        yield StackClient(state), daemon
    finally:
        if load is not None:
            load.kill()
            load.wait()
        if daemon is not None:
            daemon.stop()
        launcher.stop(cfg.run_dir)


def test_an_unknown_service_is_refused_with_the_configured_ones(watched):
    _, daemon = watched
    out = run_slotune("attribute", "gatewy", "--url", daemon.url)
    assert out.returncode == 2
    assert "no service 'gatewy'" in out.stderr and "gateway, inference" in out.stderr


def test_a_blocked_event_loop_is_named_with_its_share_and_exported(watched):
    stack, daemon = watched
    time.sleep(CALM_S)
    calm = json.loads(run_slotune("attribute", "gateway", "--json", "--url", daemon.url).stdout)
    assert "no dominant cause" in calm["verdict"] or calm["top_cause"] != "blocking_syscalls"
    stack.patch("gateway", blocking_io_ms=20)
    record = None
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        record = json.loads(run_slotune("attribute", "gateway", "--json", "--url", daemon.url).stdout)
        if record["top_cause"] == "blocking_syscalls":
            break
        time.sleep(1)
    assert record["top_cause"] == "blocking_syscalls", record["verdict"]
    assert record["shares"]["blocking_syscalls"] == max(record["shares"].values()) > DOMINANT_SHARE
    time.sleep(3)                      # the 2 s "recent" span now lies wholly inside the fault
    settled = json.loads(run_slotune("attribute", "gateway", "--json", "--url", daemon.url).stdout)
    assert 0.01 < settled["evidence"]["blocking_syscalls"]["recent"] < 0.04   # s per request; 20 ms pushed
    table = run_slotune("attribute", "gateway", "--url", daemon.url)
    assert table.returncode == 0
    print(table.stdout)               # what a user sees (pytest -s)
    assert "blocking_syscalls" in table.stdout and table.stdout.startswith("gateway P")   # P99 or P50 moved
    metrics = daemon.metrics()
    assert 'slotune_attribution_share_ratio{cause="blocking_syscalls",service="gateway"}' in metrics


def test_no_daemon_is_a_clear_error():
    port = launcher.free_ports(1)[0]
    out = run_slotune("attribute", "gateway", "--url", f"http://127.0.0.1:{port}")
    assert out.returncode == 1
    assert "no daemon answers" in out.stderr
