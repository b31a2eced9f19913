"""slotune under systemd: sd_notify over a real AF_UNIX datagram socket, and the unit file."""
import os
import socket
import subprocess
import sys

import pytest

from daemon import sdnotify
from tests.conftest import ROOT


@pytest.fixture
def notify_socket(tmp_path, monkeypatch):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "notify"))
    sock.settimeout(5)
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "notify"))
    try:
        yield sock
    finally:
        sock.close()


def test_states_arrive_as_systemd_reads_them(notify_socket):
    assert sdnotify.ready()
    assert notify_socket.recv(4096) == b"READY=1"
    assert sdnotify.status("watching 2 services\n p99 ok")
    assert notify_socket.recv(4096) == b"STATUS=watching 2 services p99 ok"  # one line
    assert sdnotify.watchdog_ping()
    assert notify_socket.recv(4096) == b"WATCHDOG=1"
    assert sdnotify.reloading()
    lines = notify_socket.recv(4096).decode().split("\n")
    assert lines[0] == "RELOADING=1" and int(lines[1].removeprefix("MONOTONIC_USEC=")) > 0
    assert sdnotify.stopping()
    assert notify_socket.recv(4096) == b"STOPPING=1"


def test_abstract_socket(monkeypatch):
    name = f"slotune-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(5)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert sdnotify.ready()
        assert sock.recv(4096) == b"READY=1"


def test_a_child_started_by_systemd_reaches_the_socket(notify_socket):
    """The daemon runs as its own process: the environment systemd sets is all it needs."""
    child = subprocess.run([sys.executable, "-c", "from daemon import sdnotify; sdnotify.ready()"],
                           cwd=ROOT, timeout=30)
    assert child.returncode == 0
    assert notify_socket.recv(4096) == b"READY=1"


def test_nothing_happens_outside_systemd(monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    assert sdnotify.ready() is False and sdnotify.watchdog_ping() is False
    assert sdnotify.watchdog_interval() is None


def test_a_vanished_socket_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "gone"))
    with pytest.raises(OSError, match=f"NOTIFY_SOCKET={tmp_path}/gone failed"):
        sdnotify.ready()
    monkeypatch.setenv("NOTIFY_SOCKET", "relative/path")
    with pytest.raises(ValueError, match="neither a path nor an abstract socket"):
        sdnotify.ready()


def test_watchdog_interval_is_for_this_process_only(monkeypatch):
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    assert sdnotify.watchdog_interval() == 30.0
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert sdnotify.watchdog_interval() == 30.0
    monkeypatch.setenv("WATCHDOG_PID", str(os.getppid()))
    assert sdnotify.watchdog_interval() is None
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    monkeypatch.setenv("WATCHDOG_USEC", "thirty")
    with pytest.raises(ValueError, match="WATCHDOG_USEC='thirty'"):
        sdnotify.watchdog_interval()
