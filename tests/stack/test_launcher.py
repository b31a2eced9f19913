"""`python -m reference_stack up | status | down` as a user runs them, and the
systemd units checked by systemd-analyze."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from reference_stack import launcher

ROOT = Path(__file__).resolve().parents[2]
UNITS = sorted((ROOT / "systemd").glob("slotune-stack-*.service"))


def cli(*args, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "reference_stack", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def test_up_status_down(tmp_path):
    run_dir = tmp_path / "run"
    ports = launcher.free_ports(8)
    flags = ["--run-dir", str(run_dir), "--gateway-port", str(ports[0]), "--inference-port", str(ports[1]),
             "--sidecar-port", str(ports[2]), "--sidecar-admin-port", str(ports[3]), "--redis-port", str(ports[4]),
             "--tool-port", f"search={ports[5]}", "--tool-port", f"calculator={ports[6]}",
             "--tool-port", f"weather={ports[7]}", "--set", "inference.max_batch_size=16", "--device", "cpu"]
    up = cli("up", *flags)
    try:
        assert up.returncode == 0, up.stderr
        state = json.loads((run_dir / "state.json").read_text())
        assert oct((run_dir / "admin.token").stat().st_mode & 0o777) == "0o600"
        for name, pid in state["pids"].items():
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if name != "redis":     # slotune finds services by this command line
                service = b"tool" if name in ("search", "calculator", "weather") else name.encode()
                assert cmdline[1:4] == [b"-m", b"reference_stack", service], cmdline
        status = cli("status", "--run-dir", str(run_dir))
        assert set(json.loads(status.stdout)["health"].values()) == {"up"}, status.stdout
        token = (run_dir / "admin.token").read_text().strip()
        req = urllib.request.Request(state["urls"]["inference"] + "/admin/config",
                                     headers={"Authorization": f"Bearer {token}"})
        assert json.loads(urllib.request.urlopen(req, timeout=10).read())["settings"]["max_batch_size"] == 16
    finally:
        down = cli("down", "--run-dir", str(run_dir))
    assert down.returncode == 0 and "inference" in down.stdout, down.stderr
    assert all(not launcher._ours(pid) for pid in state["pids"].values())
    assert not (run_dir / "state.json").exists()
    again = cli("down", "--run-dir", str(run_dir))
    assert again.returncode == 1 and "no stack state" in again.stderr


def test_up_names_the_process_that_failed(tmp_path):
    (busy,) = launcher.free_ports(1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", busy))
        s.listen()
        ports = launcher.free_ports(7)
        up = cli("up", "--run-dir", str(tmp_path), "--gateway-port", str(busy), "--inference-port", str(ports[0]),
                 "--sidecar-port", str(ports[1]), "--sidecar-admin-port", str(ports[2]),
                 "--redis-port", str(ports[3]), "--tool-port", f"search={ports[4]}",
                 "--tool-port", f"calculator={ports[5]}", "--tool-port", f"weather={ports[6]}", "--device", "cpu")
    assert up.returncode == 1
    assert "gateway exited" in up.stderr and "address already in use" in up.stderr.lower(), up.stderr
    assert not (tmp_path / "state.json").exists()


def test_a_bad_port_in_the_environment_is_named():
    result = subprocess.run([sys.executable, "-m", "reference_stack", "tool", "--name", "weather"], cwd=ROOT,
                            capture_output=True, text=True, timeout=60,
                            env=dict(os.environ, SLOTUNE_STACK_WEATHER_PORT="82o3"))
    assert result.returncode != 0 and "SLOTUNE_STACK_WEATHER_PORT='82o3' is not a TCP port" in result.stderr


def test_one_unit_per_service():
    names = {u.name for u in UNITS}
    assert names == {"slotune-stack-gateway.service", "slotune-stack-inference.service",
                     "slotune-stack-sidecar.service", "slotune-stack-tool@.service", "slotune-stack-redis.service"}


@pytest.mark.parametrize("unit", UNITS, ids=lambda u: u.name)
def test_units_verify_clean(unit, tmp_path):
    if not shutil.which("systemd-analyze"):
        pytest.fail("systemd-analyze missing: apt-get install systemd")
    name = unit.name.replace("@.", "@search.")
    checkable = tmp_path / name          # verify wants ExecStart's binary to exist: point it at this checkout
    checkable.write_text(unit.read_text().replace("/opt/slotune/.venv/bin/python", sys.executable)
                         .replace("/opt/slotune", str(ROOT)))
    if "@" in name:
        shutil.copy(checkable, tmp_path / unit.name)
    result = subprocess.run(["systemd-analyze", "verify", str(checkable)], capture_output=True, text=True,
                            timeout=60, env=dict(os.environ, SYSTEMD_LOG_LEVEL="warning"))
    problems = [line for line in (result.stdout + result.stderr).splitlines()
                if "slotune-stack" in line]
    assert result.returncode == 0 and not problems, result.stdout + result.stderr
