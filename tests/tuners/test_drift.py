"""Drift detectors pinned on hand-computed cases, plus the acceptance figures on simulated streams."""
import numpy as np
import pytest

from bench.sim import drift_bench
from tests.tuners.purity import assert_pure
from slotune.tuners import drift

P = drift.POLICIES
BASE = drift.Baseline(mean=1.0, std=0.02, windows=168)


def obs(value, baseline=BASE, samples=(), now=0.0):
    return drift.Observation(now=now, value=value, baseline=baseline, samples=samples)


def alerts(name, values, baseline=BASE):
    p = P[name]
    s, out = p.initial_state({}), []
    for v in values:
        s, d = p.decide(s, obs(v, baseline))
        out.append(d.alert)
    return out


def test_whitepaper_8_percent_rule():
    assert alerts("whitepaper", [1.09, 1.07, 0.91, 0.93]) == [True, False, True, False]


def test_zscore_3_sigma():
    assert alerts("zscore", [1.07, 1.05, 0.93]) == [True, False, True]


def test_cusum_accumulates_and_resets():
    s = drift.Cusum()
    fired = []
    for _ in range(4):
        s, f = drift.cusum_step(s, 2.0, 0.5, 5.0)
        fired.append(f)
    assert fired == [False, False, False, True] and s == drift.Cusum()
    assert alerts("cusum", [1.04] * 4) == [False, False, False, True]   # z = 2: 1.5, 3, 4.5, 6 > 5


def test_page_hinkley_fires_on_the_jump_not_before():
    s = drift.PageHinkley()
    for _ in range(10):
        s, fired = drift.page_hinkley_step(s, 0.0)
        assert not fired
    s, fired = drift.page_hinkley_step(s, 100.0)   # up = 100 - 100/11 - 0.005 - ~0.05 > 50
    assert fired


def test_ks_compares_distributions():
    rng = np.random.default_rng(0)
    base = drift.Baseline(1.0, 0.02, 168, tuple(rng.lognormal(0, 0.5, 1000)))
    same = tuple(rng.lognormal(0, 0.5, 200))
    moved = tuple(rng.lognormal(0.5, 0.5, 200))
    ks = P["ks"]
    assert not ks.decide(None, obs(1.0, base, same))[1].alert
    assert ks.decide(None, obs(1.0, base, moved))[1].alert


def test_siegmund_matches_the_textbook_run_length():
    # one-sided ARL0 for k = 0.5, h = 5 is about 938 windows (Siegmund); two-sided half of it
    assert abs(2 * drift.siegmund_arl0(0.5, 5.0) - 938) < 2
    h = drift.cusum_h(0.5)
    assert drift.siegmund_arl0(0.5, h) >= drift.ARL0 > drift.siegmund_arl0(0.5, h - 0.25)


def test_slotune_ignores_one_outlier_window_but_not_a_sustained_shift():
    # sigma = 2 % * sqrt(1 + 1/168) = 0.02006; fast CUSUM k = log(1.1) / 2 / sigma = 2.38, h = 2.5
    assert alerts("slotune", [1.07, 1.0, 1.0, 1.0]) == [False] * 4      # z 3.37: up 0.99, then 0
    assert alerts("slotune", [1.08, 1.08]) == [False, True]             # z 3.84 twice: up 1.46, 2.92 > 2.5
    assert alerts("slotune", [1.02] * 40).index(True) > 10                # creeping: the slow CUSUM


def test_slotune_alarms_in_one_window_on_a_rise_only():
    assert alerts("slotune", [1.09]) == [True]                            # z 4.30 > 4: a regression
    # a fall of the same size is an improvement: the fast CUSUM gets z clipped to -(k + 0.99 h)
    # = -4.85, down 2.47 < 2.5, and reports it from the second window
    assert alerts("slotune", [0.91, 0.91]) == [False, True]
    assert alerts("slotune", [0.5, 0.5]) == [False, True]


def test_robust_std_ignores_outlier_windows():
    # median 3, MAD 1: clipped at 3 +- 2 * 1.4826 -> 1, 2, 3, 4, 5.9652; their std 1.9109,
    # over 0.95945 (the std of a standard normal clipped at +-2) = 1.9917; the plain std is 43.6
    assert abs(drift.robust_std([1, 2, 3, 4, 100]) - 1.9917) < 1e-3
    gaussian = np.random.default_rng(0).normal(5.0, 2.0, 100_000)
    assert abs(drift.robust_std(gaussian) / gaussian.std() - 1) < 0.01     # Gaussian windows: their std


def test_robust_std_names_bad_input():
    for bad in ([1.0], [1.0, float("nan")], [[1.0, 2.0], [3.0, 4.0]]):
        with pytest.raises(ValueError, match="per-window values"):
            drift.robust_std(bad)


def test_slotune_one_window_alarm_uses_the_robust_spread():
    # heavy-tailed hours: std inflated to 4 %, robust std 1.5 %: the alarm sits at
    # 4 * 1.5 % * sqrt(1 + 1/168) = 0.06018 in log, i.e. +6.20 %
    heavy = drift.Baseline(mean=1.0, std=0.04, windows=168, robust_std=0.015)
    assert alerts("slotune", [1.065], heavy) == [True]       # log 0.0630 > 0.0602
    assert alerts("slotune", [1.06], heavy) == [False]       # log 0.0583; CUSUM z = 0.0583 / 0.0401 = 1.45
    assert alerts("slotune", [0.935], heavy) == [False]      # a fall of the same size: not in one window
    # without a robust std the std stands in: +6.5 % is 1.57 sigma
    assert alerts("slotune", [1.065], drift.Baseline(mean=1.0, std=0.04, windows=168)) == [False]


def test_policies_are_pure():
    values = [1.0, 1.03, 0.98, 1.1, 1.12, 1.0, 0.9]
    assert_pure(P, {}, [obs(v, samples=tuple(np.linspace(0.5, 1.5, 30) * v)) for v in values])


def test_slotune_detects_10_percent_within_2_windows_without_false_alarms():
    shifted = [drift_bench.run_one("slotune", "shift_10", seed, quick=True) for seed in range(4)]
    assert np.median([r["delay_windows"] for r in shifted]) <= 2
    null = [drift_bench.run_one("slotune", "null", seed, quick=True)["fa_per_week"] for seed in range(3)]
    assert np.mean(null) <= 1
    low = [drift_bench.run_one(p, "null_low_traffic", 1, quick=True)["fa_per_week"] for p in ("slotune", "whitepaper")]
    assert low[0] < low[1]
