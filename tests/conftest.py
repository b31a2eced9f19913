"""Shared test fixtures: the repo root, a way to run the real `slotune` CLI, and the
base of the tests' stand-in collectors."""
import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def package_folders() -> dict[str, str]:
    """setup.py's FOLDERS (import name -> the checkout's folder), read without running it:
    {"slotune": "daemon", "slotune.tuners": "tuners", "slotune.bpf": "bpf"}."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    found = next(node.value for node in tree.body if isinstance(node, ast.Assign)
                 and any(isinstance(t, ast.Name) and t.id == "FOLDERS" for t in node.targets))
    return ast.literal_eval(found)


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
    return subprocess.run([sys.executable, "-m", "slotune.cli", *args], cwd=ROOT, capture_output=True,
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


def copy_of_the_tree(dest: Path) -> Path:
    """The tree as it is (the files git tracks, as in the working tree) in dest/tree,
    committed in a repository of its own: `git status` there says what changed since."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    archive = subprocess.run(["tar", "-c", "--null", "-T", "-", "-f", "-"], cwd=ROOT, input=files,
                             capture_output=True, check=True).stdout
    tree = dest / "tree"
    tree.mkdir()
    subprocess.run(["tar", "-x", "-f", "-"], cwd=tree, input=archive, check=True)
    for cmd in (["init", "-q"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "copy"]):
        subprocess.run(["git", *cmd], cwd=tree, check=True)
    return tree


# The slotune package of a copy: the checkout's editable install maps `slotune` onto this
# checkout's folders, so a script run in a copy loads the copy's daemon/ as slotune, with
# tuners/ and bpf/ found beside it (setup.py's layout).
SLOTUNE_OF_THE_COPY = """import importlib.util as _u, sys as _s
_spec = _u.spec_from_file_location("slotune", "daemon/__init__.py", submodule_search_locations=["daemon", "."])
_s.modules["slotune"] = _m = _u.module_from_spec(_spec)
_spec.loader.exec_module(_m)
"""


def run_in(tree: Path, script: str, *args: str, timeout: float = 300) -> list[str]:
    """The lines a Python script prints, run in the copy (its modules, not this checkout's);
    it must exit 0."""
    out = subprocess.run([sys.executable, "-c", SLOTUNE_OF_THE_COPY + script, *args], cwd=tree,
                         capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()


def changed(tree: Path) -> str:
    """`git status --porcelain` of the copy: what is there that its commit did not have."""
    return subprocess.run(["git", "status", "--porcelain"], cwd=tree, capture_output=True, text=True,
                          check=True).stdout
