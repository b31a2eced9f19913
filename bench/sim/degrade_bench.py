"""Degrade scenarios: the throttle's service (8 workers, FIFO queue, lognormal service
times) with a dimmer in front, a degraded answer costing a quarter of a full one's service time
(no tool calls, which take half of it, and half the tokens); slotune's throttle runs beside every dimmer
policy but in `step_alone`. The oracle sets the ratio each second from the true offered load
and capacity (the ratio that keeps the workers 90 % busy). Per run: the share of offered requests answered within the SLO with a degraded answer
counted as half (primary) and as a whole, the refused and degraded shares, and the seconds
with the window P99 over the SLO."""
from __future__ import annotations

import numpy as np

from bench.sim import arrivals, service
from tuners import degrade, throttle
from tuners.base import Decision, Policy

SLO_P99_OF_FULL = 1.5            # SLO = 1.5 x the no-load P99 of full answers, as the throttle bench's
MODEL = service.ServiceModel(workers=8, median_s=0.040, sigma=0.5,
                             slo_s=float(SLO_P99_OF_FULL * 0.040 * np.exp(2.326 * 0.5)), degraded_cost=0.25)
SCENARIOS = ("step", "ramp", "diurnal", "burst", "step_alone")
POLICIES = ("slotune", "whitepaper", "brownout", "no_dimmer", "oracle")
METRICS = (("half_credit", "within SLO (degraded = ½)", "high"), ("full_credit", "within SLO (degraded = 1)", "high"),
           ("refused", "refused", "low"), ("degraded", "degraded", "low"), ("over_slo_s", "s P99>SLO", "low"))
PRIMARY = "half_credit"


def _rates(scenario: str, duration: int, cap: float) -> np.ndarray:
    t = np.arange(duration, dtype=float)
    if scenario in ("step", "step_alone"):   # 0.5C -> 1.5C -> 0.5C
        return arrivals.profile("step", duration, cap)
    if scenario == "ramp":       # 0.1C -> 5C: past 4C even degrading everything is not enough
        return (0.1 + 4.9 * t / max(1, duration - 1)) * cap
    if scenario == "diurnal":    # a compressed day, 0.4C at night to 1.6C at the peak
        return 1.25 * arrivals.profile("diurnal", duration, cap)
    if scenario == "burst":      # 0.6C with 3C for a tenth of the run, half-way
        return np.where(np.abs(t - duration / 2) < duration / 20, 3.0, 0.6) * cap
    raise ValueError(f"unknown degrade scenario {scenario!r}; use one of {SCENARIOS}")


def _oracle(rates: np.ndarray) -> Policy:
    ideal = np.clip((1 - 0.9 * MODEL.capacity_rps / rates) / (1 - MODEL.degraded_cost), 0.0, 1.0)

    def decide(state, obs):   # obs.now: the second about to start
        ratio = float(ideal[min(int(obs.now), len(ideal) - 1)])
        return state, Decision({degrade.SETTING: ratio}, "the true load")
    return Policy("oracle", "the ratio from the true load", lambda settings: None, decide)


def _no_throttle() -> Policy:
    return Policy("none", "no limit", lambda settings: None, lambda state, obs: (state, Decision({}, "no throttle")))


def run_one(policy_name: str, scenario: str, seed: int, quick: bool) -> dict[str, float]:
    duration = 60 if quick else 180
    rng = np.random.default_rng(seed)
    rates = _rates(scenario, duration, MODEL.capacity_rps)
    times = arrivals.poisson(rates, rng)
    if policy_name in ("no_dimmer", "oracle"):
        dimmer = None if policy_name == "no_dimmer" else _oracle(rates)
    else:
        dimmer = degrade.POLICIES[policy_name]
    settings = {degrade.SETTING: 0.0}
    if scenario == "step_alone":
        throttler = _no_throttle()
    else:
        throttler, settings["concurrency_limit"] = throttle.POLICIES["slotune"], 4.0 * MODEL.workers
    res = service.run(throttler, MODEL, times, np.ones(duration), settings, rng, duration, dimmer=dimmer)
    offered = max(1.0, res["offered"].sum())
    good_full = res["goodput"].sum() - res["good_degraded"].sum()
    return {
        "half_credit": float((good_full + 0.5 * res["good_degraded"].sum()) / offered),
        "full_credit": float(res["goodput"].sum() / offered),
        "refused": float(res["rejected"].sum() / offered),
        "degraded": float(res["degraded"].sum() / offered),
        "over_slo_s": float(np.count_nonzero(res["p99"] > MODEL.slo_s)),
    }
