"""The control API every service shares (GET/PATCH /admin/config): the token,
loopback-only peers, validation naming the key and range, all-or-nothing
changes, concurrent PATCHes, the change log and the setting gauges."""
from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reference_stack import launcher
from tests.stack.conftest import one_service

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("service", ["gateway", "inference", "sidecar", "search"])
def test_every_service_reports_settings_and_bounds(stack, service):
    status, body = stack.admin(service)
    assert status == 200
    assert set(body["settings"]) == set(body["bounds"]) == set(body["help"]) and body["settings"]
    for key, (low, high) in body["bounds"].items():
        assert low <= body["settings"][key] <= high


@pytest.mark.parametrize("token", ["", "wrong-token"])
def test_a_missing_or_wrong_token_gets_401(stack, token):
    before = stack.settings("inference")
    assert stack.admin("inference", token=token)[0] == 401
    status, body = stack.admin("inference", "PATCH", {"max_batch_size": 3}, token=token)
    assert status == 401 and "admin.token" in body["error"]
    assert stack.settings("inference") == before


def test_unknown_key_is_refused_by_name_and_nothing_changes(stack):
    before = stack.settings("inference")
    status, body = stack.admin("inference", "PATCH", {"max_batch_size": 4, "max_batch": 4})
    assert status == 400 and "'max_batch'" in body["error"] and "max_batch_size" in body["error"]
    assert stack.settings("inference") == before


@pytest.mark.parametrize("service, change, words", [
    ("inference", {"max_batch_size": 500}, ["max_batch_size", "[1, 128]"]),
    ("inference", {"max_batch_size": 2.5}, ["max_batch_size", "whole number"]),
    ("gateway", {"trace_sample_rate": -0.1}, ["trace_sample_rate", "[0, 1]"]),
    ("gateway", {"llm_via_sidecar": "maybe"}, ["llm_via_sidecar", "true or false"]),
    ("search", {"failure_rate": "lots"}, ["failure_rate", "not a number"]),
])
def test_out_of_range_is_refused_naming_key_and_range(stack, service, change, words):
    before = stack.settings(service)
    # A valid change in the same body must not be applied either: all or nothing.
    valid = {"inference": {"max_queue_delay_ms": 77}, "gateway": {"intent_threshold": 0.5},
             "search": {"latency_ms": 1}}[service]
    status, body = stack.admin(service, "PATCH", {**valid, **change})
    assert status == 400
    assert all(w in body["error"] for w in words), body["error"]
    assert stack.settings(service) == before


def test_a_body_that_is_not_an_object_is_refused(stack):
    status, body = stack.admin("gateway", "PATCH", [["rate_limit_rps", 5]])
    assert status == 400 and "JSON object" in body["error"]


def test_concurrent_patches_never_leave_a_mix(stack):
    before = stack.settings("inference")
    a = {"max_batch_size": 3, "max_queue_delay_ms": 33.0, "blocking_io_ms": 0.0}
    b = {"max_batch_size": 7, "max_queue_delay_ms": 77.0, "blocking_io_ms": 0.0}
    try:
        jobs = [("PATCH", a if i % 2 else b) for i in range(30)] + [("GET", None)] * 30
        jobs = [j for pair in zip(jobs[:30], jobs[30:]) for j in pair]
        results = stack.concurrently(lambda job: stack.admin("inference", job[0], job[1]), jobs)
        seen = [body["settings"] for status, body in results if status == 200]
        assert len(seen) == 60
        assert all(s in (a, b, before) for s in seen), [s for s in seen if s not in (a, b, before)]
        assert stack.settings("inference") in (a, b)
    finally:
        stack.patch("inference", **before)


def test_changes_are_logged_and_exported_as_gauges(stack):
    before = stack.settings("gateway")["intent_threshold"]
    stack.patch("gateway", intent_threshold=0.9)
    try:
        assert stack.metric("gateway", "gateway_setting", setting="intent_threshold") == 0.9
        deadline = time.monotonic() + 10
        while f"config change intent_threshold: {before} -> 0.9" not in stack.log("gateway"):
            assert time.monotonic() < deadline, stack.log("gateway")[-2000:]
            time.sleep(0.1)
    finally:
        stack.patch("gateway", intent_threshold=before)
    assert stack.metric("gateway", "gateway_setting", setting="intent_threshold") == before


def non_loopback_address() -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))          # no packet is sent; picks the outgoing interface
            address = s.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith("127.") else address


def test_non_loopback_peers_get_403(stack, tmp_path):
    """A tool listening on all addresses, reached through the host's own non-loopback address."""
    address = non_loopback_address()
    if address is None:
        pytest.skip("this host has no non-loopback IPv4 address to connect from")
    (port,) = launcher.free_ports(1)
    with one_service(["tool", "--name", "calculator", "--host", "0.0.0.0", "--port", str(port),
                      "--run-dir", str(tmp_path), "--token-file", stack.state["token_file"]],
                     f"http://127.0.0.1:{port}/healthz"):
        auth = {"Authorization": f"Bearer {stack.token}"}
        status, body = stack.http("GET", f"http://{address}:{port}/admin/config", headers=auth)
        assert status == 403 and address in body["error"]
        assert stack.http("GET", f"http://127.0.0.1:{port}/admin/config", headers=auth)[0] == 200


def test_a_bad_initial_setting_stops_the_service_with_the_reason(tmp_path):
    result = subprocess.run([sys.executable, "-m", "reference_stack", "tool", "--name", "search",
                             "--run-dir", str(tmp_path), "--port", "1", "--set", "failure_rate=2"],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "failure_rate=2.0 is out of range; allowed range [0, 1]" in result.stderr


def test_the_reference_actuator_reads_the_numbers_and_pushes_a_change_to_a_real_service(stack):
    from slotune.actuators.http_json import HttpJsonActuator
    actuator = HttpJsonActuator(stack.urls["gateway"] + "/admin/config", stack.state["token_file"],
                                settings_key="settings")
    before = stack.settings("gateway")
    current = actuator.current()
    assert "llm_via_sidecar" not in current          # a boolean is not a number to tune
    assert current["intent_threshold"] == before["intent_threshold"]
    try:
        actuator.push({"intent_threshold": 0.7, "concurrency_limit": 12.0})
        after = stack.settings("gateway")
        assert (after["intent_threshold"], after["concurrency_limit"]) == (0.7, 12)
    finally:
        stack.patch("gateway", intent_threshold=before["intent_threshold"],
                    concurrency_limit=before["concurrency_limit"])
