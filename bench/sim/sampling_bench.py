"""Sampling scenarios: per-second request counts, lognormal latencies and errors; a tracer
keeps a request when the tail rule says so (error, or slower than the threshold) or when a
uniform draw falls under the sample rate. Metrics: |traces/s - budget|/budget, and the
shares of error requests and of requests above the window's true P99 that were kept."""
from __future__ import annotations

import numpy as np

from bench.sim import arrivals
from slotune.tuners import sampling

SCENARIOS = ("step", "ramp", "diurnal", "heavy_tail", "bursts", "error_bursts", "low_traffic")
POLICIES = ("slotune", "whitepaper", "jaeger")
METRICS = (("budget_error", "|kept-budget|/budget", "low"), ("errors_kept", "errors kept", "high"),
           ("slow_kept", ">P99 kept", "high"))
PRIMARY = "budget_error"
BASE_RPS, BUDGET = 200.0, 10.0
START = {"trace_sample_rate": 0.1}


def _traffic(scenario: str, duration: int, rng):
    rates = np.full(duration, BASE_RPS)
    errors = np.full(duration, 0.002)
    sigma = 0.6
    if scenario in ("step", "ramp", "diurnal"):
        rates = arrivals.profile(scenario, duration, BASE_RPS)
    elif scenario == "heavy_tail":
        sigma = 1.5
    elif scenario == "bursts":
        counts = np.histogram(arrivals.gamma_bursts(rates, rng), bins=np.arange(duration + 1))[0]
        return counts, errors, sigma
    elif scenario == "error_bursts":  # 10 s of 5 % errors every minute
        errors = np.where(np.arange(duration) % 60 < 10, 0.05, 0.002)
    elif scenario == "low_traffic":
        rates = np.linspace(1.0, 5.0, duration)
    elif scenario != "steady":
        raise ValueError(f"unknown sampling scenario {scenario!r}; use one of {SCENARIOS}")
    return rng.poisson(rates), errors, sigma


def run_one(policy_name: str, scenario: str, seed: int, quick: bool) -> dict[str, float]:
    duration = 120 if quick else 300
    rng = np.random.default_rng(seed)
    counts, error_p, sigma = _traffic(scenario, duration, rng)
    policy = sampling.POLICIES[policy_name]
    state = policy.initial_state(START)
    rate, keep_slower = START["trace_sample_rate"], 0.0
    kept_s, err_total, err_kept, slow_total, slow_kept = np.zeros(duration), 0, 0, 0, 0
    for sec in range(duration):
        n = int(counts[sec])
        lat = rng.lognormal(np.log(0.05), sigma, n)
        err = rng.random(n) < error_p[sec]
        keep = rng.random(n) < rate
        if keep_slower > 0:
            keep |= err | (lat > keep_slower)
        kept_s[sec] = np.count_nonzero(keep)
        err_total += np.count_nonzero(err)
        err_kept += np.count_nonzero(keep & err)
        if n:
            slow = lat > np.quantile(lat, 0.99)
            slow_total += np.count_nonzero(slow)
            slow_kept += np.count_nonzero(keep & slow)
        p90, p99 = (np.quantile(lat, (0.9, 0.99)) if n else (0.0, 0.0))
        obs = sampling.Observation(now=sec + 1.0, request_rps=float(n), error_rps=float(np.count_nonzero(err)),
                                   p90_s=float(p90), p99_s=float(p99), kept_rps=kept_s[sec],
                                   budget_traces_per_s=BUDGET)
        state, decision = policy.decide(state, obs)
        rate = decision.changes.get("trace_sample_rate", rate)
        keep_slower = decision.changes.get("trace_keep_slower_than_s", keep_slower)
    # over 10 s blocks (the count noise of single seconds is no controller's fault), after a
    # 10 s start; with low traffic the best possible is keeping everything: min(budget, requests)
    blocks = (duration - 10) // 10
    kept = kept_s[10:10 + 10 * blocks].reshape(blocks, 10).mean(axis=1)
    target = np.minimum(BUDGET, counts[10:10 + 10 * blocks]).reshape(blocks, 10).mean(axis=1)
    return {"budget_error": float(np.mean(np.abs(kept - target)) / BUDGET),
            "errors_kept": float(err_kept / max(1, err_total)), "slow_kept": float(slow_kept / max(1, slow_total))}
