"""Degrade scenarios: the throttle's service (8 workers, FIFO queue, lognormal service
times) with a dimmer in front, under a constant overload of a known capacity C (0.8x to
3x, after 20 s at 0.5x), a load step 0.5x -> 1.5x -> 0.5x and a compressed day
0.4x-1.6x. Each on two services: `cheap`, where a degraded answer costs a quarter of a
full one's work (no tool calls, half the tokens), and `batched`, where answers run in
batches of 8 as long as their longest, so a degraded answer saves its work only in a
batch of degraded answers (an engine's static batches). slotune's throttle runs beside
every dimmer policy (`no_dimmer`: the throttle alone). The oracle is the best static
setting for that scenario: a concurrency limit and a ratio from a grid, each run on the
scenario with another seed and the best by the primary metric kept. Per run: the share
of offered requests answered within the SLO with a degraded answer counted as half
(primary) and as a whole, the refused and degraded shares, and the seconds with the
window P99 over the SLO."""
from __future__ import annotations

import functools
import itertools

import numpy as np

from bench.sim import arrivals, service
from slotune.tuners import degrade, throttle
from slotune.tuners.base import Decision, Policy

SLO_P99_OF_FULL = 1.5            # SLO = 1.5 x the no-load P99 of full answers, as the throttle bench's
SLO_S = float(SLO_P99_OF_FULL * 0.040 * np.exp(2.326 * 0.5))
MODELS = {"cheap": service.ServiceModel(workers=8, median_s=0.040, sigma=0.5, slo_s=SLO_S, degraded_cost=0.25),
          "batched": service.ServiceModel(workers=8, median_s=0.040, sigma=0.5, slo_s=SLO_S, degraded_cost=0.25,
                                          batch=8)}
LEVELS = {"0.8x": 0.8, "1.2x": 1.2, "1.5x": 1.5, "2x": 2.0, "3x": 3.0}
SCENARIOS = tuple(f"{load} {model}" for model in MODELS for load in (*LEVELS, "step", "diurnal"))
POLICIES = ("slotune", "whitepaper", "brownout", "no_dimmer", "oracle")
METRICS = (("half_credit", "within SLO (degraded = ½)", "high"), ("full_credit", "within SLO (degraded = 1)", "high"),
           ("refused", "refused", "low"), ("degraded", "degraded", "low"), ("over_slo_s", "s P99>SLO", "low"))
PRIMARY = "half_credit"
START_LIMIT = 32.0               # the throttle's (and the oracle grid's middle) concurrency limit
ORACLE_GRID = {"concurrency_limit": (16.0, 32.0, 64.0), "degrade_ratio": (0.0, 0.25, 0.5, 0.75, 1.0)}
ORACLE_SEED = 1000               # the sweep's own seed: the oracle is not picked on the run it is scored on


def _rates(load: str, duration: int, cap: float) -> np.ndarray:
    t = np.arange(duration, dtype=float)
    if load in LEVELS:
        return np.where(t < 20, 0.5, LEVELS[load]) * cap
    if load == "step":           # 0.5C -> 1.5C -> 0.5C
        return arrivals.profile("step", duration, cap)
    if load == "diurnal":        # a compressed day, 0.4C at night to 1.6C at the peak
        return 1.25 * arrivals.profile("diurnal", duration, cap)
    raise ValueError(f"unknown degrade load {load!r}")


def _static() -> Policy:
    return Policy("static", "settings as given", lambda settings: None,
                  lambda state, obs: (state, Decision({}, "static")))


def _simulate(scenario: str, seed: int, quick: bool, throttler: Policy, dimmer, settings: dict) -> dict[str, float]:
    load, model_name = scenario.split()
    model = MODELS[model_name]
    duration = 60 if quick else 180
    rng = np.random.default_rng(seed)
    rates = _rates(load, duration, model.capacity_rps)
    times = arrivals.poisson(rates, rng)
    res = service.run(throttler, model, times, np.ones(duration), dict(settings), rng, duration, dimmer=dimmer)
    offered = max(1.0, res["offered"].sum())
    good_full = res["goodput"].sum() - res["good_degraded"].sum()
    return {
        "half_credit": float((good_full + 0.5 * res["good_degraded"].sum()) / offered),
        "full_credit": float(res["goodput"].sum() / offered),
        "refused": float(res["rejected"].sum() / offered),
        "degraded": float(res["degraded"].sum() / offered),
        "over_slo_s": float(np.count_nonzero(res["p99"] > model.slo_s)),
    }


@functools.lru_cache(maxsize=None)
def best_static(scenario: str, quick: bool) -> tuple[float, float]:
    """The grid's (concurrency limit, ratio) with the highest primary metric on the scenario, seed ORACLE_SEED."""
    scores = {point: _simulate(scenario, ORACLE_SEED, quick, _static(), None,
                               {"concurrency_limit": point[0], degrade.SETTING: point[1]})[PRIMARY]
              for point in itertools.product(*ORACLE_GRID.values())}
    return max(scores, key=scores.get)


def run_one(policy_name: str, scenario: str, seed: int, quick: bool) -> dict[str, float]:
    if policy_name == "oracle":
        limit, ratio = best_static(scenario, quick)
        return _simulate(scenario, seed, quick, _static(), None, {"concurrency_limit": limit, degrade.SETTING: ratio})
    dimmer = None if policy_name == "no_dimmer" else degrade.POLICIES[policy_name]
    return _simulate(scenario, seed, quick, throttle.POLICIES["slotune"], dimmer,
                     {"concurrency_limit": START_LIMIT, degrade.SETTING: 0.0})
