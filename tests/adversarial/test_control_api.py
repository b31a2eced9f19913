"""The reference stack's control API (PATCH /admin/config) against bodies built
to break it: numbers JSON or Python read as NaN or infinity, integers too long
to convert, a body over the size limit. Each is a 4xx naming the key, never a
500, and nothing changes. One real gateway process, over HTTP."""
from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from reference_stack import launcher
from reference_stack.launcher import init_run_dir
from tests.stack.conftest import one_service


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("stack")
    token = init_run_dir(run_dir)["token_file"]
    (port,) = launcher.free_ports(1)
    with one_service(["gateway", "--port", str(port), "--run-dir", str(run_dir), "--token-file", str(token)],
                     f"http://127.0.0.1:{port}/healthz"):
        yield f"http://127.0.0.1:{port}/admin/config", token.read_text().strip()


def call(gateway, method: str = "GET", body: bytes | None = None) -> tuple[int, dict]:
    url, token = gateway
    req = urllib.request.Request(url, data=body, method=method,
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.parametrize("key", ["concurrency_limit", "rate_limit_rps"])   # an int and a float setting
@pytest.mark.parametrize("value", [b"NaN", b"Infinity", b"-Infinity", b"1e400", b'"inf"', b'"nan"',
                                   b"9" * 10_000, b'"' + b"9" * 10_000 + b'"', b"9" * 400],
                         ids=["NaN", "Infinity", "-Infinity", "1e400", "inf-string", "nan-string",
                              "a-10000-digit-integer", "a-10000-digit-string", "a-400-digit-integer"])
def test_a_value_no_setting_can_hold_is_a_400_naming_the_key(gateway, key, value):
    before = call(gateway)[1]["settings"]
    status, body = call(gateway, "PATCH", b'{"intent_threshold": 0.5, "%s": %s}' % (key.encode(), value))
    assert status == 400 and f"{key}=" in body["error"], body
    assert "allowed range" in body["error"] and len(body["error"]) < 500
    assert call(gateway)[1]["settings"] == before


def test_a_2_mib_body_is_a_413(gateway):
    before = call(gateway)[1]["settings"]
    status, body = call(gateway, "PATCH", b'{"rate_limit_rps": 5, "pad": "' + b"x" * (2 << 20) + b'"}')
    assert status == 413 and "larger than" in body["error"]
    assert call(gateway)[1]["settings"] == before


def test_a_body_nested_100_000_deep_is_a_400(gateway):
    status, body = call(gateway, "PATCH", b'{"rate_limit_rps": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
    assert status == 400 and "JSON object" in body["error"]
