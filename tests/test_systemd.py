"""slotune under systemd: sd_notify over a real AF_UNIX datagram socket, and the unit file."""
import os
import posixpath
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib

import pytest

from bench.unit_sandbox import UNIT, unit_privileges, unit_section, unit_values, unit_view
from slotune.host import sdnotify
from reference_stack import launcher
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
    child = subprocess.run([sys.executable, "-c", "from daemon.host import sdnotify; sdnotify.ready()"],
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


def test_a_sighup_right_at_ready_does_not_kill_it(notify_socket, tmp_path):
    """systemd may deliver `systemctl reload` (SIGHUP) the moment READY=1 arrives: the handlers
    must be in place by then, or Python's default action kills the daemon. The gap would be a few
    microseconds, too short to hit reliably from here, so the order is read from the system calls
    (strace): SIGHUP's handler goes in before READY=1 is sent. Then the SIGHUP is sent."""
    if not shutil.which("strace"):
        pytest.fail("strace missing: apt-get install strace")
    port = launcher.free_ports(1)[0]
    conf = tmp_path / "slotune.toml"
    conf.write_text(f"""[daemon]
exporter_address = "127.0.0.1:{port}"
baseline_store = "{tmp_path}/baselines.sqlite"
audit_log = "{tmp_path}/audit.jsonl"
probes = []
[services.api]
cmdline = "slotune-test-nothing-matches-{os.getpid()}"
slo_p99_ms = 100
""")
    log, trace = tmp_path / "daemon.log", tmp_path / "syscalls"
    with open(log, "wb") as out:
        tracer = subprocess.Popen(["strace", "-f", "-qq", "-s", "64", "-e", "trace=rt_sigaction,sendto,sendmsg",
                                   "-o", str(trace), sys.executable, "-m", "slotune.cli", "run", "--config", str(conf)],
                                  cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    daemon = None
    try:
        notify_socket.settimeout(60)
        while notify_socket.recv(4096) != b"READY=1":
            pass
        daemon = int(open(f"/proc/{tracer.pid}/task/{tracer.pid}/children").read().split()[0])
        os.kill(daemon, signal.SIGHUP)
        notify_socket.settimeout(15)
        after = [notify_socket.recv(4096), notify_socket.recv(4096)]   # the reload says so, then READY=1 again
        assert after[0].startswith(b"RELOADING=1\n") and after[1] == b"READY=1", after
        time.sleep(1.0)
        assert tracer.poll() is None, f"the daemon died (status {tracer.returncode}):\n{log.read_text()}"
        assert f"config reloaded from {conf}" in log.read_text()
    finally:
        if tracer.poll() is None:
            os.kill(daemon, signal.SIGTERM) if daemon else tracer.kill()
        status = tracer.wait(timeout=30)
    assert status == 0, log.read_text()
    calls = trace.read_text().splitlines()
    handler = next(i for i, c in enumerate(calls) if re.search(r"rt_sigaction\(SIGHUP, \{sa_handler=0x", c))
    ready = next(i for i, c in enumerate(calls) if '"READY=1"' in c)
    assert handler < ready, f"READY=1 was sent before SIGHUP had a handler:\n{calls[handler]}\n{calls[ready]}"


EXAMPLE = ROOT / "slotune.example.toml"
MAX_EXPOSURE = 3.6  # systemd-analyze security --offline=yes (systemd 252): 3.6 OK; a change may not raise it


def size_bytes(value: str) -> int:
    """systemd's sizes: 1G, 768M, 512K or bytes."""
    units = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
    return int(float(value[:-1]) * units[value[-1]]) if value[-1] in units else int(value)


def test_unit_bounds_its_resources_and_its_restarts():
    """Limits sized from the measured footprint (docs/daemon.md: RSS ~230-260 MiB, 2 threads, ~95 fds)."""
    unit, service = unit_section("Unit"), unit_section("Service")
    for key in ("StartLimitIntervalSec", "StartLimitBurst"):   # [Unit]: in [Service] systemd ignores them
        assert key in unit, f"[Unit] {key}= missing"
    assert int(unit["StartLimitBurst"]) >= 2 and int(unit["StartLimitIntervalSec"]) > 0
    for key in ("MemoryMax", "TasksMax", "LimitNOFILE"):
        assert key in service, f"[Service] {key}= missing"
    assert size_bytes(service["MemoryMax"]) >= 3 * 260 * 2**20, "MemoryMax= below 3x the daemon's steady RSS"
    if "MemoryHigh" in service:
        assert size_bytes(service["MemoryHigh"]) < size_bytes(service["MemoryMax"])
    assert int(service["TasksMax"]) >= 16 and int(service["LimitNOFILE"].split(":")[0]) >= 1024
    assert "OPENBLAS_NUM_THREADS=1" in unit_values("Environment"), "threads would grow with the host's CPUs"


def example_paths() -> dict[str, str]:
    """Every path the example config gives the daemon: its [daemon] table's and each token_file."""
    example = tomllib.loads(EXAMPLE.read_text())
    paths = {f"daemon.{k}": v for k, v in example.get("daemon", {}).items()
             if isinstance(v, str) and "/" in v and "://" not in v}
    for name, service in example["services"].items():
        control = service.get("control", {})
        paths |= {f"services.{name}.control.{k}": control[k] for k in ("token_file", "path", "pid_file")
                  if control.get(k)}
    return paths


def test_example_config_paths_hold_under_the_unit():
    """PrivateTmp= gives the unit its own /tmp and /var/tmp: a path there is not the file another
    service wrote (nor one it reads). ProtectSystem=strict leaves only StateDirectory= and
    ReadWritePaths= writable; ProtectHome= hides /home, /root and /run/user."""
    paths = example_paths()
    assert {"daemon.baseline_store", "daemon.audit_log"} <= set(paths), paths
    assert any(k.endswith(".token_file") for k in paths), paths
    writable = ["/var/lib/" + d for d in unit_values("StateDirectory")] + unit_values("ReadWritePaths")
    for key, path in paths.items():
        assert posixpath.isabs(path), f"{key} = {path!r}: not absolute (a unit's working directory is /)"
        norm = posixpath.normpath(path)
        for hidden in ("/tmp", "/var/tmp", "/home", "/root", "/run/user"):
            assert norm != hidden and not norm.startswith(hidden + "/"), \
                f"{key} = {path!r} is under {hidden}, which the unit does not share with other services"
        if key.startswith("daemon."):   # the daemon writes these
            assert any(norm.startswith(w.rstrip("/") + "/") for w in writable), \
                f"{key} = {path!r} is outside the unit's writable paths {writable}"


@pytest.fixture
def checkable_unit(tmp_path):
    """The unit with ExecStart at this checkout's slotune: verify wants the binary to exist."""
    slotune = ROOT / ".venv" / "bin" / "slotune"
    assert slotune.exists(), f"{slotune} missing: run scripts/setup.sh"
    unit = tmp_path / "slotune.service"
    unit.write_text(UNIT.read_text().replace("/opt/slotune/.venv/bin/slotune", str(slotune)))
    return unit


def systemd_analyze(*args) -> subprocess.CompletedProcess:
    if not shutil.which("systemd-analyze"):
        pytest.fail("systemd-analyze missing: apt-get install systemd (Debian's package 'systemd' carries it)")
    return subprocess.run(["systemd-analyze", *args], capture_output=True, text=True, timeout=60)


def test_unit_verifies_clean(checkable_unit):
    result = systemd_analyze("verify", str(checkable_unit))
    assert result.returncode == 0 and result.stdout + result.stderr == "", result.stdout + result.stderr


def test_unit_exposure_is_ok(checkable_unit):
    result = systemd_analyze("security", "--offline=yes", "--no-pager", str(checkable_unit))
    match = re.search(r"Overall exposure level for slotune.service: ([\d.]+) (\w+)", result.stdout)
    assert match, result.stdout + result.stderr
    print(f"systemd-analyze security --offline=yes: exposure {match[1]} {match[2]}")
    assert float(match[1]) <= MAX_EXPOSURE, result.stdout


def allowed_syscalls(names: list[str]) -> set[str]:
    """Expand SystemCallFilter's groups (@name) into syscall names, as systemd does."""
    allowed = set()
    for name in names:
        if not name.startswith("@"):
            allowed.add(name)
            continue
        listing = systemd_analyze("syscall-filter", name).stdout.splitlines()[1:]
        members = [line.strip() for line in listing if line.strip() and not line.strip().startswith("#")]
        allowed |= allowed_syscalls(members)
    return allowed


def unit_syscalls() -> set[str]:
    """The system calls the unit's SystemCallFilter= lines allow: each line adds its list,
    or, written ~list, takes it away (systemd reads them in order)."""
    allowed = set()
    for line in UNIT.read_text().splitlines():
        if line.startswith("SystemCallFilter="):
            value = line.split("=", 1)[1]
            if value.startswith("~"):
                allowed -= allowed_syscalls(value[1:].split())
            else:
                allowed |= allowed_syscalls(value.split())
    return allowed


def unit_filter(trace) -> list[str]:
    """A command prefix: what follows runs under the unit's SystemCallFilter= (a call outside it
    fails with SystemCallErrorNumber=EPERM, injected by strace), its calls counted into trace."""
    assert unit_section("Service").get("SystemCallErrorNumber") == "EPERM"
    allowed = ",".join("?" + name for name in sorted(unit_syscalls()))   # ?: a name strace lacks is no error
    return ["strace", "-f", "-qq", "-c", "-o", str(trace), "-e", f"inject=!{allowed}:error=EPERM"]


def syscalls_made(trace) -> set[str]:
    """The system calls in strace -c's table."""
    return {line.split()[-1] for line in open(trace).read().splitlines() if re.match(r"\s*\d", line)} - {"total"}


def test_probes_attach_with_only_the_units_capabilities_and_syscalls(root_only, tmp_path):
    """Run the BPF probe kinds the daemon uses (tracepoint, uprobe) and read another process's
    /proc/<pid>/maps with exactly the unit's capability set, in the unit's file system view and
    under its system call filter, and check every syscall made is in that filter."""
    assert "User" not in unit_section("Service") and not unit_values("AmbientCapabilities"), \
        "root gets its bounding set whole; ambient capabilities are for a User= (and add to the exposure)"
    if not shutil.which("strace"):
        pytest.fail("strace missing: apt-get install strace (it lists the syscalls the probes make)")
    trace = tmp_path / "syscalls"
    probe = ("from daemon.host import kernel_features as kf\n"
             "for check in (kf.check_bcc_tracepoint, kf.check_uprobe):\n"
             "    f = check(); print(f.ok, f.name, f.detail)\n"
             "import os, sys\n"
             "pid = sys.argv[1]\n"
             "print(bool(open(f'/proc/{pid}/maps').readline() and os.listdir(f'/proc/{pid}/fd')),"
             " 'maps and fds of a process of another user')")
    other = subprocess.Popen(["sleep", "120"], user=65534, group=65534, extra_groups=[])   # nobody
    try:
        result = subprocess.run(
            [*unit_view(tmp_path), *unit_filter(trace), *unit_privileges(),
             sys.executable, "-c", probe, str(other.pid)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    finally:
        other.kill()
        other.wait()
    assert result.returncode == 0, result.stderr
    assert [line.split()[0] for line in result.stdout.splitlines()] == ["True"] * 3, result.stdout
    used = syscalls_made(trace)
    assert used, trace.read_text()
    assert used - unit_syscalls() == set()
