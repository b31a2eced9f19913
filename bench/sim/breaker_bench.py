"""Breaker scenarios: a tool called at an open-loop rate whose failure probability changes
over time, behind a breaker with the usual mechanics (opens on the failure ratio of the last
10 s with at least 10 calls, or on a run of consecutive failures; stays open `open_s`; then
5 probe calls, all must succeed to close; the first failure reopens it). Lost calls = failed calls sent + refused calls that
would have succeeded: what the tool's callers lose."""
from __future__ import annotations

import numpy as np

from slotune.tuners import breaker

SCENARIOS = ("null", "outage", "partial_outage", "degraded", "flapping", "error_bursts", "low_traffic")
POLICIES = ("slotune", "whitepaper", "pybreaker", "resilience4j")
METRICS = (("lost_calls", "lost calls", "low"), ("dead_calls", "calls to dead tool", "low"),
           ("false_trips", "false trips", "low"), ("time_to_open_s", "open s", "low"),
           ("time_to_close_s", "close s", "low"))
PRIMARY = "lost_calls"
START = {"breaker_failure_threshold": 0.5, "breaker_consecutive_failures": 0.0, "breaker_open_s": 30.0}
WINDOW_S, MIN_CALLS, PROBES = 10, 10, 5


def failure_profile(scenario: str, duration: int, rng) -> tuple[np.ndarray, float]:
    """Failure probability per second and calls/s. Outages last 60-120 s, drawn per seed, so
    that no fixed open period happens to line up with their end."""
    t = np.arange(duration)
    p = np.full(duration, 0.001)
    mid = (t >= duration // 3) & (t < duration // 3 + int(rng.integers(60, 121)))
    rate = 20.0
    if scenario in ("outage", "low_traffic"):
        p[mid] = 1.0
        rate = 2.0 if scenario == "low_traffic" else rate
    elif scenario == "partial_outage":
        p[mid] = 0.7
    elif scenario == "degraded":
        p[mid] = 0.05
    elif scenario == "flapping":  # 10 s dead, 10 s healthy, for two minutes
        p[(t >= duration // 3) & (t < duration // 3 + 120) & ((t // 10) % 2 == 0)] = 1.0
    elif scenario == "error_bursts":  # 3 s of failures every 40 s
        p[(t % 40) < 3] = 1.0
    elif scenario != "null":
        raise ValueError(f"unknown breaker scenario {scenario!r}; use one of {SCENARIOS}")
    return p, rate


def _trip_index(fails: np.ndarray, prior_calls: int, prior_fails: int, streak: int, s: breaker.BreakerState) -> int:
    """Index of the call at which the closed breaker opens in this second, or -1."""
    if fails.size == 0:
        return -1
    calls = prior_calls + np.arange(1, fails.size + 1)
    ratio_trip = (calls >= MIN_CALLS) & ((prior_fails + np.cumsum(fails)) >= s.threshold * calls)
    hits = list(np.flatnonzero(ratio_trip)[:1])
    if s.consecutive > 0:
        run = streak
        for k, f in enumerate(fails):
            run = run + 1 if f else 0
            if run >= s.consecutive:
                hits.append(k)
                break
    return min(hits) if hits else -1


def run_one(policy_name: str, scenario: str, seed: int, quick: bool) -> dict[str, float]:
    duration = 200 if quick else 400
    rng = np.random.default_rng(seed)
    p, rate = failure_profile(scenario, duration, rng)
    policy = breaker.POLICIES[policy_name]
    state = policy.initial_state(START)
    settings = breaker.BreakerState(*(START[n] for n in breaker.NAMES))
    win_calls, win_fails = np.zeros(duration, int), np.zeros(duration, int)
    is_open, open_until, streak, probed = False, 0.0, 0, 0
    lost = dead = trips = false_trips = 0
    opened_at, closed_at = np.full(duration, -1.0), np.full(duration, -1.0)
    for sec in range(duration):
        fails = rng.random(rng.poisson(rate)) < p[sec]
        sent = np.zeros(fails.size, bool)
        lo = max(0, sec - WINDOW_S + 1)
        if is_open and sec >= open_until:  # half-open: probe calls, across seconds, decide
            probes = fails[:PROBES - probed]
            if probes.any():                  # the first failed probe reopens it at once
                probes = probes[:int(np.argmax(probes)) + 1]
            sent[:probes.size] = True
            probed += probes.size
            if probes.any():
                open_until, probed = sec + 1 + settings.open_s, 0
            elif probed >= PROBES:
                is_open, streak, probed = False, 0, 0
                closed_at[sec] = sec
                win_calls[lo:sec] = win_fails[lo:sec] = 0
        elif not is_open:
            k = _trip_index(fails, int(win_calls[lo:sec].sum()), int(win_fails[lo:sec].sum()), streak, settings)
            stop = fails.size if k < 0 else k + 1
            sent[:stop] = True
            streak = 0 if not fails[:stop].size else (streak + stop if fails[:stop].all() else
                                                      stop - 1 - int(np.flatnonzero(~fails[:stop])[-1]))
            if k >= 0:
                is_open, open_until = True, sec + 1 + settings.open_s
                trips += 1
                false_trips += int(p[sec] <= 0.01)
                opened_at[sec] = sec
        win_calls[sec], win_fails[sec] = np.count_nonzero(sent), np.count_nonzero(sent & fails)
        lost += np.count_nonzero(sent & fails) + np.count_nonzero(~sent & ~fails)
        dead += np.count_nonzero(sent) if p[sec] >= 0.5 else 0
        obs = breaker.Observation(now=sec + 1.0, calls=int(win_calls[sec]), failures=int(win_fails[sec]),
                                  breaker_open=is_open)
        state, decision = policy.decide(state, obs)
        if decision.changes:
            settings = breaker.BreakerState(*(decision.changes.get(n, v) for n, v in
                                              zip(breaker.NAMES, (settings.threshold, settings.consecutive, settings.open_s))))
    return {"lost_calls": float(lost), "dead_calls": float(dead), "false_trips": float(false_trips),
            **_delays(p, opened_at, closed_at)}


def _delays(p: np.ndarray, opened_at: np.ndarray, closed_at: np.ndarray) -> dict[str, float]:
    """Mean seconds from each failure episode's start to the next opening, and from its end to the next close."""
    bad = p >= 0.5
    starts = np.flatnonzero(bad & ~np.r_[False, bad[:-1]])
    ends = np.flatnonzero(~bad & np.r_[False, bad[:-1]])
    opens, closes = np.flatnonzero(opened_at >= 0), np.flatnonzero(closed_at >= 0)

    def delay(events, marks):
        out = [marks[marks >= e][0] - e if (marks >= e).any() else len(p) - e for e in events]
        return float(np.mean(out)) if out else float("nan")
    return {"time_to_open_s": delay(starts, opens), "time_to_close_s": delay(ends, closes)}
