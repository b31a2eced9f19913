"""Every actuator's reading of what a service sends (HTTP answers, settings files,
HAProxy's socket, the nginx include) ends in a value or an ActuatorError, on time:
deep JSON, trickling sockets, odd shapes and arbitrary bytes never raise anything
else, so a bad service costs only its own push."""
from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from types import SimpleNamespace
from typing import Callable
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slotune.actuators import ActuatorError, haproxy, http_json
from slotune.actuators.envoy import EnvoyActuator
from slotune.actuators.file import FileActuator
from slotune.actuators.haproxy import HaproxyActuator
from slotune.actuators.http_json import HttpJsonActuator
from slotune.actuators.litellm import LitellmActuator
from slotune.actuators.nginx import NginxActuator
from slotune.actuators.sglang import SglangActuator
from slotune.actuators.triton import TritonActuator
from tests.adversarial.answers import ANSWERS, FUZZ
from tests.adversarial.conftest import Scripted, reply

DEEP = b"[" * 100_000
FUZZ_FILES = settings(FUZZ, suppress_health_check=[HealthCheck.function_scoped_fixture])   # fixtures reused
STATUSES = st.sampled_from([200, 200, 200, 204, 302, 404, 500])


def only_actuator_errors(*calls: Callable[[], object]) -> None:
    for call in calls:
        try:
            call()
        except ActuatorError:
            pass


class StatsSocket(Scripted):
    """HAProxy's stats socket over TCP: one command line per connection, answered as scripted."""

    def _serve(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):      # OSError: the actuator hung up first
            conn.settimeout(10)
            line = b""
            while (chunk := conn.recv(4096)) and not (line := line + chunk).endswith(b"\n"):
                pass
            self.requests.append(line)
            self.answer(conn, line, self.stopped)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


@pytest.fixture
def stats_socket(request):
    """stats_socket(answer) -> a running StatsSocket, closed after the test."""
    def start(answer) -> StatsSocket:
        server = StatsSocket(answer)
        request.addfinalizer(server.close)
        return server
    return start


@pytest.fixture
def haproxy_socket(stats_socket):
    """One stand-in for a whole fuzz run: it answers its .said to every command."""
    server = stats_socket(lambda conn, _line, _stopped: conn.sendall(server.said))
    server.said = b""
    return server


# -- deep JSON: a RecursionError before, a refusal now --------------------------------------------

def test_a_settings_file_nested_too_deep_is_refused(tmp_path):
    path = tmp_path / "svc.json"
    path.write_bytes(DEEP)
    for call in (FileActuator(str(path)).current, lambda: FileActuator(str(path)).push({"rate": 5.0})):
        with pytest.raises(ActuatorError, match=f"settings file {path} is nested deeper than 64 levels") as err:
            call()
        assert not err.value.unreachable
    assert path.read_bytes() == DEEP


def test_a_triton_config_nested_too_deep_is_refused(serve):
    server = serve(reply(200, b'{"name": "m", "input": ' + DEEP))
    url = f"http://127.0.0.1:{server.port}"
    with pytest.raises(ActuatorError, match=f"GET {url}/v2/models/m/config: the answer is nested deeper") as err:
        TritonActuator(url, "m", {}, timeout_s=2.0).current()
    assert not err.value.unreachable


def test_a_settings_file_string_that_is_a_lone_surrogate_is_kept_as_its_escape(tmp_path):
    """json.dumps keeps the surrogate as it is: written as UTF-8 it would raise UnicodeEncodeError."""
    path = tmp_path / "svc.json"
    path.write_text('{"note": "\\ud800", "rate": 1}')
    FileActuator(str(path)).push({"rate": 5.0})
    assert json.loads(path.read_bytes()) == {"note": "\ud800", "rate": 5}


# -- HAProxy's socket: a deadline that holds, a CSV that cannot break the reader -------------------

def stream_bytes(conn: socket.socket, _line: bytes, _stopped) -> None:
    """One byte after another, never a pause long enough for a read to time out, until hung up on."""
    while True:
        conn.sendall(b"x")


@pytest.mark.timeout(30)
def test_a_haproxy_socket_that_never_stops_sending_is_cut_off_at_the_deadline(stats_socket):
    """No read starts past the deadline (one that still waited 1 ms would get a byte: on to the 4 MiB cap)."""
    server = stats_socket(stream_bytes)
    start = time.monotonic()
    with pytest.raises(ActuatorError, match=r"no complete answer to 'show info' within 0.5 s") as err:
        HaproxyActuator(server.address, {}, timeout_s=0.5).command("show info")
    assert time.monotonic() - start < 1.0
    assert err.value.unreachable


def test_a_haproxy_answer_still_coming_when_the_deadline_passes_is_cut_off(stats_socket):
    """The deadline is checked before every read. Here the clock passes it as HAProxy starts its
    answer: before, the next read still waited 1 ms and took what had come."""
    answering = threading.Event()

    def answer(conn, _line, _stopped):
        answering.set()
        conn.sendall(b"Name: HAProxy\nMaxconn: 64\n")
    server = stats_socket(answer)
    clock = SimpleNamespace(monotonic=lambda: time.monotonic() + (60.0 if answering.is_set() else 0.0))
    with mock.patch.object(haproxy, "time", clock), pytest.raises(ActuatorError, match="no complete answer"):
        HaproxyActuator(server.address, {}, timeout_s=2.0).command("show info")


def test_a_haproxy_stat_field_over_csvs_limit_is_refused(stats_socket):
    server = stats_socket(lambda conn, _line, _stopped: conn.sendall(b"# pxname,svname,slim\nbe,s1," + b"9" * 200_000))
    with pytest.raises(ActuatorError, match=r"`show stat` is not its CSV \(field larger than field limit"):
        HaproxyActuator(server.address, {"limit": "maxconn server be/s1"}).current()


# -- the nginx include: linear to read, finite numbers only --------------------------------------

def nginx(tmp_path, text: str) -> NginxActuator:
    path = tmp_path / "limits.conf"
    path.write_text(text)
    return NginxActuator(str(path), str(tmp_path / "nginx.conf"), {"conn": "limit_conn perserver {}"},
                         binary="/bin/false")


def test_an_nginx_include_of_blank_lines_is_read_in_linear_time(tmp_path):
    """\\s* at a line's start would run over every newline after it: seconds for 64 KiB."""
    actuator = nginx(tmp_path, "limit_conn perserver 8;\n" + "\n" * 65_000)
    start = time.monotonic()
    assert actuator.current() == {"conn": 8.0}
    assert time.monotonic() - start < 0.5


def test_an_nginx_number_too_large_for_a_float_is_refused(tmp_path):
    with pytest.raises(ActuatorError, match="setting conn's number .* is too large for a limit"):
        nginx(tmp_path, "limit_conn perserver " + "9" * 400 + ";\n").current()


# -- fuzz: whatever comes back, only ActuatorError -------------------------------------------------

def http_actuators(key_file: str) -> list:
    base = "http://127.0.0.1:9"
    return [
        (HttpJsonActuator(f"{base}/admin/config", settings_key="settings"), {"rate": 5.0}),
        (HttpJsonActuator(f"{base}/config"), {"rate": 5.0}),
        (EnvoyActuator(base, {"rate": "k.rate"}), {"rate": 5.0}),
        (TritonActuator(base, "m", {"delay_ms": "dynamic_batching.max_queue_delay_microseconds"}),
         {"delay_ms": 2.0, "max_batch_size": 8.0}),
        (SglangActuator(base, {}), {"max_running_requests": 8.0}),
        (LitellmActuator(base, key_file, {"rate": "rpm_limit"}), {"rate": 5.0}),
    ]


@FUZZ_FILES
@given(answer=ANSWERS, status=STATUSES)
def test_any_http_answer_gives_each_http_actuator_only_actuator_errors(tmp_path, answer, status):
    key_file = tmp_path / "key"
    key_file.write_text("sk-1234\n")
    with mock.patch.object(http_json, "exchange", lambda *args, **kwargs: (status, "", answer)):
        for actuator, changes in http_actuators(str(key_file)):
            only_actuator_errors(actuator.current, lambda actuator=actuator, changes=changes: actuator.push(changes))


@FUZZ_FILES
@given(contents=ANSWERS)
def test_any_settings_file_gives_only_actuator_errors(tmp_path, contents):
    path = tmp_path / "svc.json"
    path.write_bytes(contents)
    actuator = FileActuator(str(path))
    only_actuator_errors(actuator.current, lambda: actuator.push({"rate": 5.0}))


HAPROXY_LINES = st.sampled_from(["# pxname,svname,slim", "# pxname,svname,qcur,slim", "be,s1,5", "be,s1,", "be,s1",
                                 "be", "Name: HAProxy", "Maxconn: 7", "Maxconn: 99999999999", "Maxconn: ",
                                 '"be",s1,"5', "\x00", "x" * 200, ""])
HAPROXY_ANSWERS = st.binary(max_size=300) | st.lists(HAPROXY_LINES, max_size=6).map(
    lambda lines: "\n".join(lines).encode())


@FUZZ_FILES
@given(answer=HAPROXY_ANSWERS)
def test_any_haproxy_answer_gives_only_actuator_errors(haproxy_socket, answer):
    haproxy_socket.said = answer
    actuator = HaproxyActuator(haproxy_socket.address, {"a": "maxconn server be/s1", "b": "maxconn global"})
    only_actuator_errors(actuator.current, lambda: actuator.push({"a": 5.0, "b": 6.0}))


NGINX_PIECES = st.sampled_from(["limit_conn perserver ", "8", "9" * 400, ".5", ";", "\n", " ", "\t", "#", "{}"])
NGINX_FILES = st.binary(max_size=300) | st.lists(NGINX_PIECES, max_size=12).map(lambda p: "".join(p).encode())


@FUZZ_FILES
@given(contents=NGINX_FILES)
def test_any_nginx_include_gives_only_actuator_errors(tmp_path, contents):
    path = tmp_path / "limits.conf"
    path.write_bytes(contents)
    actuator = NginxActuator(str(path), str(tmp_path / "nginx.conf"), {"conn": "limit_conn perserver {}"},
                             binary="/bin/false")
    only_actuator_errors(actuator.current, lambda: actuator.push({"conn": 9.0}))
