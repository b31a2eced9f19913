"""`python -m bench.tuners` as a user runs it: a real process printing a table per tuner."""
import subprocess
import sys

from tests.conftest import ROOT


def test_quick_run_prints_the_table():
    out = subprocess.run([sys.executable, "-m", "bench.tuners", "--quick", "--seeds", "1", "--tuner", "budget"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "### budget" in out.stdout
    assert "| mismatched | slotune ✓ |" in out.stdout


def test_bad_seed_count_is_refused():
    out = subprocess.run([sys.executable, "-m", "bench.tuners", "--seeds", "0"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and "--seeds must be at least 1, got 0" in out.stderr
