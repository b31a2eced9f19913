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


def test_a_tie_on_the_median_goes_to_the_better_mean():
    from bench import tuners as bench
    from bench.sim import drift_bench
    delays = {"slotune": [1, 1, 2, 1], "whitepaper": [1, 1, 1, 1], "zscore": [2, 2, 1, 2]}   # medians 1, 1, 2
    results = {("drift", "shift_10", p): {"delay_windows": delays.get(p, [48] * 4)} for p in drift_bench.POLICIES}
    assert bench.best_policy(drift_bench, results, "drift", "shift_10") == "whitepaper"   # mean 1.0 < 1.25
    results[("drift", "shift_10", "slotune")] = {"delay_windows": [1, 1, 1, 1]}
    assert bench.best_policy(drift_bench, results, "drift", "shift_10") == "slotune"      # a full tie: first listed
    assert bench._fmt([1, 1, 2, 1], "mean") == "1.25"
