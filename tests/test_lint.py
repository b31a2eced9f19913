"""ruff over the whole tree with pyproject.toml's small rule set: it finds real bugs
(names shadowed, closures over loop variables, exceptions raised without their cause);
and mypy over the packages typed so far (TYPED), with pyproject.toml's [tool.mypy]."""
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


# The packages mypy passes on; a package joins once its errors are fixed (89 remain in
# daemon/control, export, collectors, demo and daemon's own modules, on 2026-12-07).
TYPED = ("tuners", "daemon/model", "daemon/attribution", "daemon/store", "daemon/host", "daemon/profiles",
         "daemon/actuators", "daemon/config.py")


def test_mypy_finds_nothing_in_the_typed_packages():
    if importlib.util.find_spec("mypy") is None:
        pytest.fail("mypy is not installed: pip install -e .[test] (scripts/setup.sh runs it)")
    result = subprocess.run([sys.executable, "-m", "mypy", "--no-error-summary", *TYPED], cwd=ROOT,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
