"""ruff over the whole tree with pyproject.toml's small rule set: it finds real bugs
(names shadowed, closures over loop variables, exceptions raised without their cause)."""
import importlib.util
import subprocess
import sys

import pytest

from tests.conftest import ROOT


def test_ruff_finds_nothing():
    if importlib.util.find_spec("ruff") is None:
        pytest.fail("ruff is not installed: pip install -e .[test] (scripts/setup.sh runs it)")
    result = subprocess.run([sys.executable, "-m", "ruff", "check", str(ROOT)], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
