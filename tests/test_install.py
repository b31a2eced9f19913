"""A plain `pip install slotune` (no extras) into a fresh virtual environment
gives a daemon that starts: the CLI, `doctor`, `status` and `run` work without
the reference stack's packages (aiohttp, redis, torch) or the report's
(matplotlib), and no installed module imports them.

The venv has no system site-packages, so the distro's bcc is absent too: the
daemon must then start degraded (kernel probes off), never with a traceback.
Wheels are cached in /tmp/slotune-pip-cache (PIP_CACHE_DIR) between runs."""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

PIP_CACHE = Path(os.environ.get("SLOTUNE_PIP_CACHE", "/tmp/slotune-pip-cache"))
EXTRAS_ONLY = ("aiohttp", "redis", "torch", "matplotlib")      # [stack] and [report]
# What no installed module may import (reference_stack runs from a checkout, for the demo).
FORBIDDEN = EXTRAS_ONLY + ("reference_stack",)
# Left out of the copy that is installed: build outputs and the checkout's own venv.
NOT_COPIED = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__",
                                    ".pytest_cache", "out")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def only_bcc_missing(output: str) -> list[str]:
    """The modules the output says are missing, other than bcc (the degraded path)."""
    return [m for m in re.findall(r"No module named '([\w.]+)'", output) if m.split(".")[0] != "bcc"]


class FreshVenv:
    def __init__(self, path: Path):
        self.path = path
        self.bin = path / "bin"
        self.python = self.bin / "python"
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "PYTHONSTARTUP")}
        self.env["PATH"] = f"{self.bin}{os.pathsep}{os.environ.get('PATH', '')}"
        self.env["PIP_CACHE_DIR"] = str(PIP_CACHE)
        # Run from a folder outside the checkout, so `import daemon` finds the installed copy.
        self.cwd = path.parent

    def run(self, *args, timeout=60, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run([str(a) for a in args], cwd=self.cwd, env=self.env, capture_output=True,
                              text=True, timeout=timeout, **kwargs)

    def slotune(self, *args, timeout=60) -> subprocess.CompletedProcess:
        return self.run(self.bin / "slotune", *args, timeout=timeout)


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> FreshVenv:
    base = tmp_path_factory.mktemp("install")
    src = base / "src"
    shutil.copytree(ROOT, src, ignore=NOT_COPIED, symlinks=True)
    PIP_CACHE.mkdir(parents=True, exist_ok=True)
    v = FreshVenv(base / "venv")
    made = v.run(sys.executable, "-m", "venv", v.path, timeout=120)
    assert made.returncode == 0, made.stderr
    # The venv module makes it with system site-packages off unless asked.
    assert "include-system-site-packages = false" in (v.path / "pyvenv.cfg").read_text()
    t0 = time.monotonic()
    installed = v.run(v.python, "-m", "pip", "install", src, timeout=800)
    assert installed.returncode == 0, \
        f"pip install (no extras) failed:\n{installed.stdout[-3000:]}\n{installed.stderr[-3000:]}"
    print(f"pip install into a fresh venv: {time.monotonic() - t0:.0f} s")
    return v


def test_the_default_install_pulls_in_neither_the_stack_nor_the_report(venv):
    probe = venv.run(venv.python, "-c",
                     "import importlib.util, json; "
                     f"print(json.dumps({{m: importlib.util.find_spec(m) is not None for m in {EXTRAS_ONLY!r}}}))")
    assert probe.returncode == 0, probe.stderr
    present = [m for m, found in json.loads(probe.stdout).items() if found]
    assert present == [], f"installed without being asked for: {present}"


def test_one_import_package_and_nothing_from_the_checkout(venv):
    """slotune claims no generic top-level name (daemon is python-daemon's), and the benches,
    tests, demo and stack run from a checkout."""
    names = ("bench", "tests", "daemon", "tuners", "bpf", "reference_stack", "slotune.demo")
    probe = venv.run(venv.python, "-c", "import importlib.util as u, json, slotune.tuners, slotune.bpf; "
                     f"print(json.dumps([n for n in {names!r} if u.find_spec(n)]))")
    assert probe.returncode == 0, probe.stderr
    assert json.loads(probe.stdout) == [], probe.stdout


def test_the_demo_says_it_runs_from_a_checkout(venv):
    out = venv.slotune("demo", "--run-dir", venv.path.parent / "demo")
    assert out.returncode == 2 and "runs from a checkout" in out.stderr, out.stdout + out.stderr
    assert "Traceback" not in out.stderr


def test_help(venv):
    out = venv.slotune("--help")
    assert out.returncode == 0, out.stderr
    assert "usage: slotune" in out.stdout
    for command in ("run", "status", "doctor", "demo", "attribute", "baseline", "probes", "dashboards"):
        assert command in out.stdout
    assert "Traceback" not in out.stderr


def test_doctor_reports_instead_of_crashing(venv):
    out = venv.slotune("doctor", timeout=120)
    text = out.stdout + out.stderr
    assert out.returncode in (0, 1), text
    assert "Traceback" not in text
    assert only_bcc_missing(text) == [], text
    assert "the daemon can" in text    # the verdict line: "can run", "can run, degraded" or "cannot run"


def test_status_without_a_daemon_fails_cleanly(venv):
    url = f"http://127.0.0.1:{free_port()}"
    out = venv.slotune("status", "--url", url, "--once")
    assert out.returncode == 1
    assert "no daemon answers" in out.stderr
    assert "Traceback" not in out.stdout + out.stderr


def test_run_starts_with_a_minimal_config_and_stops_on_sigterm(venv, tmp_path):
    web_port, exporter_port = free_port(), free_port()
    web = subprocess.Popen([str(venv.python), "-m", "http.server", str(web_port), "--bind", "127.0.0.1"],
                           cwd=tmp_path, env=venv.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    config = tmp_path / "slotune.toml"
    config.write_text(f"""
[daemon]
exporter_address = "127.0.0.1:{exporter_port}"
baseline_store = "{tmp_path / 'baselines.sqlite'}"
audit_log = "{tmp_path / 'audit.jsonl'}"

[services.web]
port = {web_port}
slo_p99_ms = 250
""")
    log = tmp_path / "run.log"
    with open(log, "w") as sink:
        daemon = subprocess.Popen([str(venv.bin / "slotune"), "run", "--config", str(config)], cwd=venv.cwd,
                                  env=venv.env, stdout=sink, stderr=subprocess.STDOUT)
    status = None
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and daemon.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{exporter_port}/status", timeout=2) as resp:
                    status = json.loads(resp.read())
                break
            except OSError:
                time.sleep(0.3)
        while status is not None and time.monotonic() < deadline + 30 and daemon.poll() is None:
            with urllib.request.urlopen(f"http://127.0.0.1:{exporter_port}/status", timeout=5) as resp:
                status = json.loads(resp.read())
            with urllib.request.urlopen(f"http://127.0.0.1:{exporter_port}/metrics", timeout=5) as resp:
                metrics = resp.read().decode()
            if re.search(r'^slotune_collector_up\{collector="kernel"\} 0', metrics, re.M):
                break        # what the test reads has been exported
            time.sleep(0.3)
        still_running = daemon.poll() is None
    finally:
        if daemon.poll() is None:
            daemon.send_signal(signal.SIGTERM)
        try:
            rc = daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            daemon.kill()
            rc = daemon.wait()
        web.terminate()
        web.wait(timeout=10)
    text = log.read_text()
    assert status is not None, f"/status never answered:\n{text}"
    assert still_running, f"the daemon exited early:\n{text}"
    assert rc == 0, f"SIGTERM should exit 0, got {rc}:\n{text}"
    assert "Traceback" not in text, text
    assert only_bcc_missing(text) == [], text
    assert "web" in status["services"]
    # Degraded, not down: the kernel collector is off without bcc, the rest runs.
    assert status["collectors"]["kernel"] is False
    assert re.search(r'^slotune_collector_up\{collector="kernel"\} 0', metrics, re.M), metrics


def test_daemon_modules_import_without_the_stack_or_the_report(venv):
    script = f"""
import importlib, json, pkgutil, sys
import slotune
assert "site-packages" in slotune.__file__, slotune.__file__
names = []
for info in pkgutil.walk_packages(slotune.__path__, "slotune."):
    importlib.import_module(info.name)
    names.append(info.name)
loaded = sorted({{m.split(".")[0] for m in sys.modules}} & set({FORBIDDEN!r}))
print(json.dumps({{"modules": names, "forbidden": loaded}}))
"""
    out = venv.run(venv.python, "-c", script, timeout=120)
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(found["modules"]) > 20, found["modules"]
    assert "slotune.process" in found["modules"] and "slotune.cli" in found["modules"]
    assert found["forbidden"] == []
