"""Shared test fixtures: the repo root, a way to run the real `slotune` CLI, and the
base of the tests' stand-in collectors."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


class StandInCollector:
    """A stand-in collector (daemon/collectors/base.py's contract) for a test that needs
    samples without probes or scrapes: nothing to attach, no parts, no families of its
    own; a subclass names itself and says what collect() returns."""
    exports_samples, up = False, True

    def start(self, services):
        pass

    def update_services(self, services):
        pass

    def close(self):
        pass

    def parts(self):
        return {}

    def metric_families(self):
        return ()


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
