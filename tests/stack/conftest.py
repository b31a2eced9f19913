"""One real reference stack (separate processes, real Redis, free loopback
ports) shared by the stack tests, started with the launcher `up` uses and
stopped, every process, at the end."""
from __future__ import annotations

import contextlib
import subprocess
import sys
import time
import urllib.request

import pytest

from reference_stack import launcher
from reference_stack.client import StackClient


@contextlib.contextmanager
def one_service(args: list[str], health_url: str):
    """`python -m reference_stack <args>` as its own process, once health_url answers; terminated after."""
    proc = subprocess.Popen([sys.executable, "-m", "reference_stack", *args], cwd=launcher.ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(health_url, timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None, f"{args} exited with status {proc.returncode}"
                assert time.monotonic() < deadline, f"{args} did not answer {health_url} within 60 s"
                time.sleep(0.2)
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(scope="session")
def stack(tmp_path_factory):
    cfg = launcher.StackConfig.on_free_ports(
        tmp_path_factory.mktemp("stack"),
        # Small and quick for tests; a short breaker cooldown so a test can wait it out.
        inference_args=launcher.SMALL_MODEL,
        settings={"gateway": {"breaker_open_s": 1}})
    state = launcher.start(cfg)
    try:
        yield StackClient(state)
    finally:
        launcher.stop(cfg.run_dir)
