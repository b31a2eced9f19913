"""The HTTP actuator against real loopback servers that answer badly on purpose:
answers that are not a JSON object of finite numbers, bodies too large or too
slow, silence, redirects towards another host, a proxy in the environment, and
each kind of refusal. Each is an ActuatorError naming the URL, on time."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from slotune.actuators import ActuatorError
from slotune.actuators.http_json import HttpJsonActuator
from tests.adversarial.conftest import header, reply
from tests.conftest import ROOT

TIMEOUT_S = 1.0


def actuator(server, token_file="", key="settings") -> HttpJsonActuator:
    return HttpJsonActuator(server.url, str(token_file), settings_key=key, timeout_s=TIMEOUT_S)


def refused(server, call="current", **kwargs) -> ActuatorError:
    act = actuator(server, **kwargs)
    with pytest.raises(ActuatorError) as err:
        act.current() if call == "current" else act.push({"rate": 5.0})
    assert server.url in str(err.value)
    return err.value


@pytest.mark.parametrize("body, key, words", [
    (b"[1, 2]", "", "got a list"),
    (b"true", "", "got a boolean"),
    (b"true", "settings", "got a boolean"),
    (b'{"settings": [["rate", 5]]}', "settings", "member 'settings': expected a JSON object"),
    (b'{"settings": true}', "settings", "got a boolean"),
    (b'{"bounds": {}}', "settings", "got null (or nothing)"),
    (b'{"settings": {"rate": ' + b"9" * 400 + b"}}", "settings", "'rate' is not a finite number"),
    (b'{"settings": {"rate": ' + b"9" * 10000 + b"}}", "settings", "not JSON"),
    (b'{"settings": {"rate": NaN}}', "settings", "'rate' is not a finite number"),
    (b'{"settings": {"rate": -Infinity}}', "settings", "'rate' is not a finite number"),
    (b'{"settings": {"rate": 1e400}}', "settings", "'rate' is not a finite number"),
    (b"<html>busy</html>", "settings", "not JSON"),
    (b"[" * 100_000, "", "nested deeper than 64 levels"),
    (b'{"settings": ' * 50_000, "settings", "nested deeper than 64 levels"),
], ids=["a-list", "true", "true-for-a-settings-object", "settings-a-list", "settings-true", "no-settings-member",
        "a-400-digit-integer", "a-10000-digit-integer", "NaN", "minus-Infinity", "1e400", "html",
        "100000-brackets", "50000-open-objects"])
def test_an_answer_that_is_not_an_object_of_finite_numbers_is_refused(serve, body, key, words):
    err = refused(serve(reply(200, body)), key=key)
    assert words in str(err) and not err.unreachable


def test_booleans_and_strings_are_not_settings_and_true_is_not_one(serve):
    server = serve(reply(200, b'{"settings": {"llm_via_sidecar": true, "mode": "fast", "limits": [1], '
                               b'"rate": 5, "ratio": 0.25}}'))
    assert actuator(server).current() == {"rate": 5.0, "ratio": 0.25}


def five_mb(with_length: bool):
    def answer(conn, _request, _stopped):
        length = "Content-Length: 5000000\r\n" if with_length else ""
        conn.sendall(f"HTTP/1.1 200 OK\r\n{length}Connection: close\r\n\r\n".encode())
        for _ in range(50):
            conn.sendall(b"7" * 100_000)
    return answer


@pytest.mark.parametrize("with_length", [True, False], ids=["5-MB-body", "5-MB-body-without-a-length"])
@pytest.mark.timeout(20)
def test_a_body_over_one_mib_is_refused(serve, with_length):
    err = refused(serve(five_mb(with_length)))
    assert "larger than 1048576 bytes" in str(err) and not err.unreachable


def trickle(head_too: bool):
    """One byte a second: the whole answer, or only the body after a prompt head."""
    def answer(conn, _request, stopped):
        body = b'{"settings": {"rate": 5}}'
        head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        if not head_too:
            conn.sendall(head)
        for byte in (head if head_too else b"") + body:
            if stopped.wait(1.0):
                return
            conn.sendall(bytes([byte]))
    return answer


def hang(conn, _request, stopped):
    stopped.wait()


@pytest.mark.parametrize("answer", [trickle(head_too=False), trickle(head_too=True), hang],
                         ids=["body-at-1-byte-a-second", "status-line-at-1-byte-a-second", "accept-and-hang"])
@pytest.mark.timeout(30)
def test_a_slow_or_silent_answer_times_out_within_the_timeout(serve, answer):
    server = serve(answer)
    start = time.monotonic()
    err = refused(server)
    assert time.monotonic() - start < TIMEOUT_S + 0.5
    assert f"no complete answer within {TIMEOUT_S:g} s" in str(err) and err.unreachable


@pytest.mark.parametrize("call", ["current", "push"])
def test_a_redirect_to_another_port_is_not_followed_and_the_token_stays(serve, token_file, call):
    elsewhere = serve(reply(200, b'{"settings": {"rate": 5}}'))
    server = serve(reply(302, b"", {"Location": elsewhere.url}))
    err = refused(server, call, token_file=token_file)
    assert "HTTP 302" in str(err) and elsewhere.url in str(err) and not err.unreachable
    assert header(server.requests[0], "Authorization") == "Bearer s3cret-token-42"
    assert elsewhere.requests == []       # so no Authorization header arrived there


def test_a_proxy_in_the_environment_is_not_used(serve, token_file):
    """In a fresh process, so that nothing read the environment before it was set."""
    proxy = serve(reply(200, b'{"settings": {"rate": 1}}'))
    server = serve(reply(200, b'{"settings": {"rate": 5}}'))
    env = {k: v for k, v in os.environ.items() if k.lower() != "no_proxy"}
    env.update({name: f"http://127.0.0.1:{proxy.port}" for name in ("http_proxy", "HTTP_PROXY", "all_proxy")})
    result = subprocess.run([sys.executable, "-c", "import sys; from slotune.actuators.http_json import "
                             "HttpJsonActuator; print(HttpJsonActuator(*sys.argv[1:3], settings_key='settings')"
                             ".current())", server.url, str(token_file)],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "{'rate': 5.0}", result.stderr
    assert proxy.requests == [] and len(server.requests) == 1


@pytest.mark.parametrize("status, unreachable", [(401, False), (409, False), (500, True), (503, True)],
                         ids=["401", "409", "500", "503"])
@pytest.mark.parametrize("call", ["current", "push"])
def test_4xx_is_a_refusal_and_5xx_is_unreachable(serve, status, unreachable, call):
    err = refused(serve(reply(status, b'{"error": "said\\nno"}\n\n<a second line>')), call)
    assert f"HTTP {status}" in str(err) and "said" in str(err) and err.unreachable is unreachable
    assert "\n" not in str(err)


def test_nothing_listening_is_unreachable():
    from tests.adversarial.conftest import Scripted
    server = Scripted(hang)
    server.close()
    err = refused(server)
    assert err.unreachable
