"""Fleet scenarios for SlotuneHostOutlier: 50 hosts serve one service; each minute every host's
P99 is drawn around the fleet's level (a fixed per-host offset, a slow per-host wander, heavy-tailed
minute noise), the fleet level may move for everyone (a diurnal load cycle, a deploy rolled out host
by host over an hour) and one host may degrade (over hours or days) or have been slow since before
the week of history its own baseline holds. The host-outlier rule (the PromQL of
dashboards/rules/slotune.rules.yml, mirrored in host_outlier_z) is ranked against the per-host
drift rules of tuners/drift.py run on each host's hourly P99 with its own 7-day baseline: detection
delay of the degrading host (hours from the start of its decline; a miss counts MISS_AFTER_H) and
alarms raised on healthy hosts per host-week.

    python -m bench.sim.fleet_bench            # 10 seeds, the README table
    python -m bench.tuners --tuner fleet       # the same through the tuner ranking
"""
from __future__ import annotations

import argparse
import math
import sys

import numpy as np

from slotune.tuners import drift

HOSTS = 50
DAY, HOUR, WEEK_MIN = 1440, 60, 7 * 1440
# The rule's constants: dashboards/rules/slotune.rules.yml, group slotune.fleet and SlotuneHostOutlier.
AVG_MIN = 10          # avg_over_time(...[10m]) of the P99 gauge, one sample a minute
Z_FLOOR = 0.05        # clamp_min(1.4826 * MAD, 0.05)
Z_ALERT = 3.5         # robust_z > 3.5
FOR_MIN = 10          # for: 10m
MAD_SIGMA = 1.4826    # a Gaussian's std over its MAD

SCENARIOS = ("quiet", "diurnal", "deploy", "degrade_hours", "degrade_days", "degrade_days_diurnal",
             "degrade_days_deploy", "slow_before_history")
SICK = {s for s in SCENARIOS if s.startswith("degrade")} | {"slow_before_history"}
POLICIES = ("host_outlier", "drift_slotune", "drift_whitepaper")
METRICS = (("fa_per_host_week", "alarms on healthy hosts / host-week", "low"),
           ("delay_h", "detection delay (h)", "low"), ("missed", "missed", "low", "mean"))
PRIMARY = {s: ("delay_h" if s in SICK else "fa_per_host_week") for s in SCENARIOS}
# The sick host's P99 grows (log terms) by this much an hour, up to +50 %: in 41 hours, or in 8 days.
DEGRADE_PER_H = {"degrade_hours": 0.01, "degrade_days": 0.05 / 24}
DEGRADE_CAP = math.log(1.5)
SLOW_ALL_ALONG = math.log(1.4)   # slow_before_history: +40 % since before its week of history
DIURNAL = 0.2             # fleet P99 +-20 % over the day (load)
DEPLOY = math.log(1.15)   # a deploy makes every host 15 % slower, rolled out over an hour
MISS_AFTER_H = 7 * 24


def host_outlier_z(ln_p99: np.ndarray) -> np.ndarray:
    """The rule's robust z-score of each host (last axis) against the fleet's median and MAD."""
    med = np.median(ln_p99, axis=-1, keepdims=True)
    mad = np.median(np.abs(ln_p99 - med), axis=-1, keepdims=True)
    return (ln_p99 - med) / np.maximum(MAD_SIGMA * mad, Z_FLOOR)


def _held(cond: np.ndarray, evaluations: int) -> np.ndarray:
    """True where cond has held for this many evaluations in a row (axis 0), as `for:` does."""
    run = np.zeros(cond.shape, dtype=np.int32)
    count = np.zeros(cond.shape[1:], dtype=np.int32)
    for t in range(cond.shape[0]):
        count = np.where(cond[t], count + 1, 0)
        run[t] = count
    return run >= evaluations


def _onsets(firing: np.ndarray) -> np.ndarray:
    """(time, host) pairs where an alert starts firing."""
    rising = firing & ~np.vstack([np.zeros((1, firing.shape[1]), bool), firing[:-1]])
    return np.argwhere(rising)


def fleet_p99(scenario: str, minutes: int, onset: int, rng) -> np.ndarray:
    """Per-minute P99 (s), shape (minutes, HOSTS); host 0 is the one that degrades."""
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown fleet scenario {scenario!r}; use one of {', '.join(SCENARIOS)}")
    t = np.arange(minutes)[:, None]
    offset = rng.normal(0, 0.03, HOSTS)                       # hardware, placement: fixed per host
    wander = np.zeros((minutes, HOSTS))                        # AR(1), about 30 minutes' memory, sd 0.03
    a = math.exp(-1 / 30)
    shocks = rng.normal(0, 0.03 * math.sqrt(1 - a * a), (minutes, HOSTS))
    for i in range(1, minutes):
        wander[i] = a * wander[i - 1] + shocks[i]
    noise = rng.standard_t(3, (minutes, HOSTS)) / math.sqrt(3) * 0.08   # a minute's P99 from few requests
    level = np.zeros((minutes, 1))
    if "diurnal" in scenario:
        level = level + DIURNAL * np.sin(2 * math.pi * (t + rng.integers(0, DAY)) / DAY)
    if "deploy" in scenario:
        at = onset + rng.integers(0, HOUR, HOSTS)           # each host gets it within the hour
        level = level + DEPLOY * (t >= at[None, :])
    sick = np.zeros((minutes, HOSTS))
    if scenario == "slow_before_history":
        sick[:, 0] = SLOW_ALL_ALONG
    elif scenario.startswith("degrade"):
        rate = DEGRADE_PER_H["degrade_hours" if scenario == "degrade_hours" else "degrade_days"]
        sick[:, 0] = np.clip((t[:, 0] - onset) / HOUR * rate, 0, DEGRADE_CAP)
    return 0.1 * np.exp(offset + wander + noise + level + sick)


def outlier_alarms(p99: np.ndarray, start: int) -> np.ndarray:
    """(minute, host) onsets of SlotuneHostOutlier from minute `start` on (one firing then counts
    there), evaluated every minute as the rules are."""
    csum = np.cumsum(np.vstack([np.zeros((1, p99.shape[1])), p99]), axis=0)
    avg = np.full(p99.shape, np.nan)
    avg[AVG_MIN - 1:] = (csum[AVG_MIN:] - csum[:-AVG_MIN]) / AVG_MIN
    z = host_outlier_z(np.log(avg[AVG_MIN - 1:]))
    firing = np.zeros(p99.shape, bool)
    firing[AVG_MIN - 1:] = _held(z > Z_ALERT, FOR_MIN + 1)
    return _onsets(firing[start:]) + [start, 0]


def drift_alarms(policy_name: str, p99: np.ndarray, start_h: int) -> np.ndarray:
    """(minute, host) onsets of the per-host drift rule on hourly P99s with a rolling 7-day baseline."""
    hours = p99.shape[0] // HOUR
    hourly = np.exp(np.log(p99[:hours * HOUR]).reshape(hours, HOUR, -1).mean(axis=1))
    policy, week = drift.POLICIES[policy_name], 7 * 24
    out = []
    for h in range(p99.shape[1]):
        state, prev = policy.initial_state({}), False
        for t in range(start_h, hours):
            past = hourly[t - week:t, h]
            base = drift.Baseline(float(past.mean()), float(past.std(ddof=1)), week, robust_std=drift.robust_std(past))
            state, decision = policy.decide(state, drift.Observation(now=t * drift.INTERVAL_S, value=float(hourly[t, h]),
                                                                     baseline=base))
            if decision.alert and not prev:
                out.append(((t + 1) * HOUR - 1, h))   # known at the end of the hour
            prev = decision.alert
    return np.asarray(out, dtype=int).reshape(-1, 2)


def run_one(policy_name: str, scenario: str, seed: int, quick: bool) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    start = WEEK_MIN                                   # a week of history before the first decision
    minutes = start + (1 if quick else 2) * WEEK_MIN
    onset = start + int(rng.integers(DAY, 2 * DAY))    # the fleet change or the sick host's first hour
    if scenario == "slow_before_history":
        onset = start                                  # delay counts from the first decision
    p99 = fleet_p99(scenario, minutes, onset, rng)
    if policy_name == "host_outlier":
        alarms = outlier_alarms(p99, start)
    elif policy_name in ("drift_slotune", "drift_whitepaper"):
        alarms = drift_alarms(policy_name.removeprefix("drift_"), p99, start // HOUR)
    else:
        raise ValueError(f"unknown fleet policy {policy_name!r}; use one of {', '.join(POLICIES)}")
    alarms = alarms[alarms[:, 0] >= start]
    degrading = scenario in SICK
    sick = (alarms[:, 1] == 0) & (alarms[:, 0] >= onset) if degrading else np.zeros(len(alarms), bool)
    host_weeks = HOSTS * (minutes - start) / WEEK_MIN
    out = {"fa_per_host_week": float(np.count_nonzero(~sick)) / host_weeks,
           "delay_h": float("nan"), "missed": float("nan")}
    if degrading:
        caught = alarms[sick, 0]
        caught = caught[caught < onset + MISS_AFTER_H * HOUR]
        out["delay_h"] = float((caught.min() - onset + 1) / HOUR) if caught.size else float(MISS_AFTER_H)
        out["missed"] = float(caught.size == 0)
    return out


def main(argv=None) -> int:
    from bench import tuners as ranking
    ap = argparse.ArgumentParser(prog="python -m bench.sim.fleet_bench", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="3 seeds of one evaluated week (smoke test)")
    ap.add_argument("--seeds", type=int, help="seeds per cell (default 10, --quick 3)")
    ap.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    args = ap.parse_args(argv)
    return ranking.main(["--tuner", "fleet", "--workers", str(args.workers)]
                        + (["--quick"] if args.quick else []) + (["--seeds", str(args.seeds)] if args.seeds else []))


if __name__ == "__main__":
    sys.exit(main())
