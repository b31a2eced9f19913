"""Which process a file actuator signals after a write, with the daemon's own
wiring (a real config, Daemon._actuators, the service found by its cmdline) and
real processes: only one of the service's own, never a group, init, slotune
itself or a bystander; a refused signal also means nothing was written."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from slotune import config
from slotune.actuators import ActuatorError
from slotune.actuators.file import FileActuator
from slotune.process import Daemon

# The service: a parent and a forked child that notes each SIGHUP and writes its pid file when ready.
SERVICE = """
import os, signal, sys, time
marker, pid_file, got = sys.argv[1:]
if os.fork() == 0:
    signal.signal(signal.SIGHUP, lambda *_: open(got, "a").write(f"{os.getpid()}\\n"))
    open(pid_file + ".new", "w").write(f"{os.getpid()}\\n")
    os.rename(pid_file + ".new", pid_file)
    while True:
        time.sleep(0.05)
os.wait()
"""


@pytest.fixture
def service(tmp_path):
    """(actuator the daemon builds for it, its settings file, its pid file, its child's pid, the signal log)."""
    marker, pid_file, got, path = f"svc-{uuid.uuid4().hex}", tmp_path / "svc.pid", tmp_path / "got", tmp_path / "s.json"
    path.write_text('{"rate_limit_rps": 100}')
    proc = subprocess.Popen([sys.executable, "-c", SERVICE, marker, str(pid_file), str(got)], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while not pid_file.exists():
            assert time.monotonic() < deadline and proc.poll() is None, "the service did not start"
            time.sleep(0.02)
        conf = tmp_path / "slotune.toml"
        conf.write_text(f"""
[services.svc]
cmdline = "{marker}"
slo_p99_ms = 100
[services.svc.control]
kind = "file"
path = "{path}"
pid_file = "{pid_file}"
signal = "HUP"
""")
        actuator = Daemon._actuators(config.load(conf))["svc"]
        yield actuator, path, pid_file, int(pid_file.read_text()), got
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_the_services_own_child_process_gets_the_signal(service):
    actuator, path, _, child, got = service
    actuator.push({"rate_limit_rps": 90.0})
    assert json.loads(path.read_text()) == {"rate_limit_rps": 90}
    deadline = time.monotonic() + 10
    while not (got.exists() and got.read_text()):
        assert time.monotonic() < deadline, "the service's process got no SIGHUP"
        time.sleep(0.02)
    assert got.read_text() == f"{child}\n"


@pytest.mark.parametrize("contents, words", [
    ("-1\n", "names pid -1, which slotune never signals"),
    ("0\n", "names pid 0, which slotune never signals"),
    ("1\n", "names pid 1, which slotune never signals"),
    ("abc\n", "does not hold a process id (it starts b'abc')"),
    ("", "does not hold a process id"),
], ids=["-1", "0", "1", "abc", "empty"])
def test_a_pid_file_naming_no_single_service_process_is_refused_and_nothing_written(service, contents, words):
    actuator, path, pid_file, _, got = service
    pid_file.write_text(contents)
    with pytest.raises(ActuatorError) as err:
        actuator.push({"rate_limit_rps": 90.0})
    assert str(pid_file) in str(err.value) and words in str(err.value) and not err.value.unreachable
    assert "the pid file must hold the service's own pid" in str(err.value) or "must write its pid" in str(err.value)
    assert json.loads(path.read_text()) == {"rate_limit_rps": 100} and not got.exists()


def test_an_unrelated_live_process_is_not_signalled(service):
    actuator, path, pid_file, _, _ = service
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        pid_file.write_text(f"{bystander.pid}\n")
        with pytest.raises(ActuatorError) as err:
            actuator.push({"rate_limit_rps": 90.0})
        assert f"names pid {bystander.pid}, which is not one of this service's processes" in str(err.value)
        assert str(pid_file) in str(err.value) and "fix the pid file or the service's declaration" in str(err.value)
        time.sleep(0.2)
        assert bystander.poll() is None                # SIGHUP would have ended it
        assert json.loads(path.read_text()) == {"rate_limit_rps": 100}
    finally:
        bystander.kill()
        bystander.wait()


def test_a_process_that_is_gone_is_unreachable(service):
    actuator, path, pid_file, _, _ = service
    gone = subprocess.Popen(["true"])
    gone.wait()
    pid_file.write_text(f"{gone.pid}\n")
    with pytest.raises(ActuatorError) as err:
        actuator.push({"rate_limit_rps": 90.0})
    assert f"names pid {gone.pid}" in str(err.value) and err.value.unreachable
    assert json.loads(path.read_text()) == {"rate_limit_rps": 100}


def test_slotunes_own_pid_is_refused_even_when_the_declaration_matches_it(tmp_path):
    pid_file, path = tmp_path / "svc.pid", tmp_path / "s.json"
    pid_file.write_text(f"{os.getpid()}\n")
    actuator = FileActuator(str(path), str(pid_file), "HUP", owns=lambda pid: True)
    with pytest.raises(ActuatorError, match=f"names pid {os.getpid()}, which slotune never signals"):
        actuator.push({"rate_limit_rps": 90.0})
    assert not path.exists()
