"""Drift scenarios: hourly windows of a latency metric (window value = median of the hour's
requests), hour-to-hour noise, a rolling 7-day baseline; null streams (no change) count
false alarms, shifted streams measure detection delay in windows (miss = none in 48)."""
from __future__ import annotations

import numpy as np

from slotune.tuners import drift

SCENARIOS = ("null", "null_heavy", "null_low_traffic", "shift_10", "shift_20", "shift_10_heavy", "creep_10")
POLICIES = ("slotune", "whitepaper", "zscore", "cusum", "page_hinkley", "ks")
METRICS = (("fa_per_week", "false alarms/week", "low"), ("delay_windows", "delay (windows)", "low"),
           ("delay_windows", "mean delay", "low", "mean"), ("missed", "missed", "low"))
PRIMARY = {s: ("fa_per_week" if s.startswith("null") else "delay_windows") for s in SCENARIOS}
WEEK, RAW = 168, 200
MISS_AFTER = 48


def _stream(scenario: str, windows: int, shift_at: int, rng):
    heavy = "heavy" in scenario
    noise = (rng.standard_t(3, windows) / np.sqrt(3) if heavy else rng.standard_normal(windows)) * 0.02
    sigma_req = 1.5 if heavy else 0.6
    n_req = 180 if "low_traffic" in scenario else 36_000
    factor = np.ones(windows)
    if scenario.startswith("shift"):
        factor[shift_at:] = 1.2 if scenario == "shift_20" else 1.1
    elif scenario == "creep_10":  # +10 % spread over a day
        factor[shift_at:] = 1 + 0.1 * np.minimum(1.0, (np.arange(windows - shift_at) + 1) / 24)
    elif not scenario.startswith("null"):
        raise ValueError(f"unknown drift scenario {scenario!r}; use one of {SCENARIOS}")
    level = 0.1 * factor * np.exp(noise)
    values = level * np.exp(rng.standard_normal(windows) * sigma_req * 1.2533 / np.sqrt(n_req))
    raw = rng.lognormal(np.log(level)[:, None], sigma_req, (windows, RAW))
    return values, raw


def run_one(policy_name: str, scenario: str, seed: int, quick: bool) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    null = scenario.startswith("null")
    start = WEEK  # one week of history before the first decision
    evaluated = (WEEK if quick else 4 * WEEK) if null else 2 * WEEK
    windows = start + evaluated
    shift_at = windows if null else start + WEEK + int(rng.integers(0, 24))
    values, raw = _stream(scenario, windows, shift_at, rng)
    policy = drift.POLICIES[policy_name]
    state = policy.initial_state({})
    alerts, prev = [], False
    for t in range(start, windows):
        past = values[t - WEEK:t]
        baseline = drift.Baseline(float(past.mean()), float(past.std(ddof=1)), WEEK, tuple(raw[t - WEEK:t:17].ravel()),
                                  robust_std=drift.robust_std(past))
        state, decision = policy.decide(state, drift.Observation(now=t * drift.INTERVAL_S, value=float(values[t]),
                                                                 baseline=baseline, samples=tuple(raw[t])))
        if decision.alert and not prev:
            alerts.append(t)
        prev = decision.alert
    alerts = np.asarray(alerts)
    false = np.count_nonzero(alerts < shift_at)
    weeks = (min(shift_at, windows) - start) / WEEK
    after = alerts[(alerts >= shift_at) & (alerts < shift_at + MISS_AFTER)]
    out = {"fa_per_week": false / weeks, "delay_windows": float("nan"), "missed": float("nan")}
    if not null:
        out["delay_windows"] = float(after[0] - shift_at + 1) if after.size else float(MISS_AFTER)
        out["missed"] = float(after.size == 0)
    return out
