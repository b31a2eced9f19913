"""Shared test fixtures: the repo root and a way to run the real `slotune` CLI."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_slotune(*args, timeout=120, **kwargs) -> subprocess.CompletedProcess:
    """Run the installed CLI as a user would, in its own process."""
    return subprocess.run([sys.executable, "-m", "daemon.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, **kwargs)


@pytest.fixture
def root_only():
    if os.geteuid() != 0:
        pytest.fail("this test needs root (make test runs as root)")


@pytest.fixture
def redis_port(tmp_path):
    """A real Redis for the test (tests/actuators/real_servers.py), its port."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (scripts/setup.sh installs it)")
    from tests.actuators import real_servers
    with real_servers.redis(tmp_path) as port:
        yield port
