"""One real reference stack (separate processes, real Redis, free loopback
ports) shared by the stack tests, started with the launcher `up` uses and
stopped, every process, at the end."""
from __future__ import annotations

import pytest

from reference_stack import launcher
from reference_stack.client import StackClient


@pytest.fixture(scope="session")
def stack(tmp_path_factory):
    cfg = launcher.StackConfig.on_free_ports(
        tmp_path_factory.mktemp("stack"),
        # Small and quick for tests; a short breaker cooldown so a test can wait it out.
        inference_args=["--device", "cpu", "--d-model", "64", "--layers", "2", "--heads", "4",
                        "--max-new-tokens", "4"],
        gateway_args=["--breaker-cooldown-s", "1"])
    state = launcher.start(cfg)
    try:
        yield StackClient(state)
    finally:
        launcher.stop(cfg.run_dir)
