"""ruff over the whole tree with pyproject.toml's small rule set: it finds real bugs
(names shadowed, closures over loop variables, exceptions raised without their cause);
and mypy over the whole slotune package (daemon/, tuners/, bpf/), with pyproject.toml's
[tool.mypy]."""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, package_folders


def test_ruff_finds_nothing():
    if importlib.util.find_spec("ruff") is None:
        pytest.fail("ruff is not installed: pip install -e .[test] (scripts/setup.sh runs it)")
    result = subprocess.run([sys.executable, "-m", "ruff", "check", str(ROOT)], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


# Where each folder is in the slotune package (setup.py), as a path: daemon -> slotune.
IN_PACKAGE = {folder: name.replace(".", "/") for name, folder in package_folders().items()}


def package_view(where: Path) -> Path:
    """The slotune package as links to the checkout's folders, laid out as installed: mypy
    reads module names from paths and does not follow the editable install's mapping."""
    package = where / "slotune"
    package.mkdir()
    for folder, path in IN_PACKAGE.items():
        if path == "slotune":        # the package's own folder: its entries, beside the others
            for entry in (ROOT / folder).iterdir():
                (package / entry.name).symlink_to(entry)
        else:
            (where / path).symlink_to(ROOT / folder)
    return where


def test_mypy_finds_nothing_in_the_package(tmp_path):
    if importlib.util.find_spec("mypy") is None:
        pytest.fail("mypy is not installed: pip install -e .[test] (scripts/setup.sh runs it)")
    view = package_view(tmp_path)
    result = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
                             "--no-error-summary", "slotune"], cwd=view, env={**os.environ, "MYPYPATH": str(view)},
                            capture_output=True, text=True, timeout=600)
    said = result.stdout + result.stderr
    for folder, name in sorted(IN_PACKAGE.items(), key=lambda fn: -len(fn[1])):   # slotune/tuners/ first
        said = said.replace(name + "/", folder + "/")       # errors by the checkout's paths
    assert result.returncode == 0, said
