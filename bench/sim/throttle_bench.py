"""Throttle scenarios and per-run metrics: goodput, seconds with P99 over the SLO,
settling time after the 3x load step, oscillation of the setting, regret vs the oracle
(the best static concurrency limit, found by an offline sweep over the same seeds)."""
from __future__ import annotations

import functools

import numpy as np

from bench.sim import arrivals, service
from slotune.tuners import throttle

BASE = service.ServiceModel(workers=8, median_s=0.040, sigma=0.5, slo_s=0.0)
SCENARIOS = ("step", "ramp", "diurnal", "heavy_tail", "bursts", "capacity_drop", "low_traffic")
POLICIES = ("slotune", "whitepaper", "gradient2", "vegas", "envoy", "oracle")
METRICS = (("goodput_ratio", "goodput/offered", "high"), ("over_slo_s", "s P99>SLO", "low"),
           ("settle_s", "settle s", "low"), ("oscillation", "osc", "low"), ("regret", "regret", "low"))
PRIMARY = "over_slo_s"
ORACLE_LIMITS = (1.0, 1.25, 1.5, 2.0, 3.0)  # x workers


def _model(scenario: str) -> service.ServiceModel:
    if scenario == "heavy_tail":
        sigma = 1.25
        m = service.ServiceModel(8, 0.045 / np.exp(sigma ** 2 / 2), sigma, 0.0)
    elif scenario == "low_traffic":
        m = service.ServiceModel(1, 0.120, 0.5, 0.0)
    else:
        m = BASE
    p99 = m.median_s * np.exp(2.326 * m.sigma)
    return service.ServiceModel(m.workers, m.median_s, m.sigma, slo_s=float(1.5 * p99))


def _load(scenario: str, duration: int, cap: float, rng) -> tuple[np.ndarray, np.ndarray]:
    slow = np.ones(duration)
    if scenario in ("step", "ramp", "diurnal"):
        rates = arrivals.profile(scenario, duration, cap)
    elif scenario == "heavy_tail":
        rates = arrivals.profile("step", duration, cap)
    elif scenario == "capacity_drop":
        rates = np.full(duration, 0.9 * cap)
        slow[duration // 3:] = 1.5
    elif scenario == "bursts":
        return arrivals.gamma_bursts(np.full(duration, 0.9 * cap), rng), slow
    elif scenario == "low_traffic":
        rates = np.linspace(1.0, 5.0, duration)
    else:
        raise ValueError(f"unknown throttle scenario {scenario!r}; use one of {SCENARIOS}")
    return arrivals.poisson(rates, rng), slow


def _static():
    return throttle.Policy("static", "fixed limit", lambda s: None, lambda s, o: (s, throttle.Decision({}, "static")))


def _simulate(policy, limit_key: str, start: float, scenario: str, seed: int, duration: int):
    model = _model(scenario)
    rng = np.random.default_rng(seed)
    times, slow = _load(scenario, duration, model.capacity_rps, rng)
    return service.run(policy, model, times, slow, {limit_key: start}, rng, duration), model


def _settle(p99: np.ndarray, slo: float, start: int, end: int, hold: int = 5) -> float:
    ok = p99[start:end] <= slo
    for k in range(len(ok) - hold + 1):
        if ok[k:k + hold].all():
            return float(k)
    return float(end - start)


def _goodput(res) -> float:
    return float(res["goodput"].sum() / max(1.0, res["offered"].sum()))


@functools.lru_cache(maxsize=None)
def oracle_limit(scenario: str, duration: int) -> float:
    """The best static concurrency limit on three sweep seeds that no measured run uses."""
    workers = _model(scenario).workers
    best = max(ORACLE_LIMITS, key=lambda k: np.mean([_goodput(_simulate(
        _static(), "concurrency_limit", k * workers, scenario, 10_000 + s, duration)[0]) for s in range(3)]))
    return best * workers


def run_one(policy_name: str, scenario: str, seed: int, quick: bool) -> dict[str, float]:
    duration = 60 if quick else 180
    model = _model(scenario)
    oracle = _simulate(_static(), "concurrency_limit", oracle_limit(scenario, duration), scenario, seed, duration)[0]
    if policy_name == "oracle":
        res = oracle
    else:
        policy = throttle.POLICIES[policy_name]
        key, start = (("rate_limit_rps", model.capacity_rps) if policy_name == "whitepaper"
                      else ("concurrency_limit", 4.0 * model.workers))
        res = _simulate(policy, key, start, scenario, seed, duration)[0]
    third = duration // 3
    setting = np.log(np.maximum(res["setting"], 1e-9))
    return {
        "goodput_ratio": _goodput(res),
        "over_slo_s": float(np.count_nonzero(res["p99"] > model.slo_s)),
        "settle_s": _settle(res["p99"], model.slo_s, third, 2 * third) if scenario == "step" else float("nan"),
        "oscillation": float(np.mean(np.abs(np.diff(setting[5:])))),
        "regret": 1.0 - _goodput(res) / max(1e-9, _goodput(oracle)),
    }
