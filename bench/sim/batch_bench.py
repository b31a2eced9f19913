"""Batch scenarios and per-run metrics: goodput (share of offered requests answered within
the SLO), regret vs the oracle (best static (batch size, queue delay) from an offline sweep),
oscillation of the batch size."""
from __future__ import annotations

import functools

import numpy as np

from bench.sim import arrivals, batcher
from slotune.tuners import batch

SCENARIOS = ("step", "ramp", "diurnal", "heavy_tail", "bursts", "capacity_drop", "low_traffic")
POLICIES = ("slotune", "whitepaper", "clipper_aimd", "triton", "oracle")
METRICS = (("goodput_ratio", "goodput/offered", "high"), ("regret", "regret", "low"),
           ("p99_ms", "P99 ms", "low"))
PRIMARY = "goodput_ratio"
START = {"max_batch_size": 8.0, "max_queue_delay_ms": 5.0}
ORACLE_SIZES = (8, 16, 24, 32, 48, 128)
ORACLE_DELAYS_MS = (0.0, 10.0)


def _model(scenario: str) -> batcher.BatchModel:
    sigma = 1.0 if scenario == "heavy_tail" else 0.15
    return batcher.BatchModel(a_s=0.015, c_s=0.0025, noise_sigma=sigma, slo_s=0.150)


def capacity(model: batcher.BatchModel) -> float:
    """C: throughput at the largest batch whose two back-to-back runs fit the SLO."""
    size = int((model.slo_s / 2 - model.a_s) / model.c_s)
    return model.capacity_rps(size)


def _load(scenario: str, duration: int, rng):
    cap = capacity(_model(scenario))
    slow = np.ones(duration)
    if scenario == "step":
        rates = np.where((np.arange(duration) >= duration // 3) & (np.arange(duration) < 2 * duration // 3), 0.9, 0.3) * cap
    elif scenario == "ramp":
        rates = np.linspace(0.1, 1.1, duration) * cap
    elif scenario == "diurnal":
        rates = arrivals.profile("diurnal", duration, cap) * 0.7
    elif scenario in ("heavy_tail", "capacity_drop"):
        rates = np.full(duration, 0.6 * cap)
        if scenario == "capacity_drop":
            slow[duration // 3:] = 1.5
    elif scenario == "bursts":
        return arrivals.gamma_bursts(np.full(duration, 0.6 * cap), rng), slow
    elif scenario == "low_traffic":
        rates = np.linspace(1.0, 5.0, duration)
    else:
        raise ValueError(f"unknown batch scenario {scenario!r}; use one of {SCENARIOS}")
    return arrivals.poisson(rates, rng), slow


def _static():
    return batch.Policy("static", "fixed", lambda s: None, lambda s, o: (s, batch.Decision({}, "static")))


def _simulate(policy, settings, scenario: str, seed: int, duration: int) -> np.ndarray:
    model = _model(scenario)
    rng = np.random.default_rng(seed)
    times, slow = _load(scenario, duration, rng)
    return batcher.run(policy, model, times, slow, settings, rng, duration), model.slo_s


def _good(lat_slo) -> float:
    lat, slo = lat_slo
    return float(np.count_nonzero(lat <= slo) / max(1, lat.size))


@functools.lru_cache(maxsize=None)
def oracle_settings(scenario: str, duration: int) -> tuple[float, float]:
    """The best static (size, delay) on three sweep seeds that no measured run uses."""
    grid = [(b, d) for b in ORACLE_SIZES for d in ORACLE_DELAYS_MS]
    score = {g: np.mean([_good(_simulate(_static(), {"max_batch_size": g[0], "max_queue_delay_ms": g[1]},
                                         scenario, 10_000 + s, duration)) for s in range(3)]) for g in grid}
    return max(grid, key=score.get)


def run_one(policy_name: str, scenario: str, seed: int, quick: bool) -> dict[str, float]:
    duration = 90 if quick else 240
    b, d = oracle_settings(scenario, duration)
    oracle = _simulate(_static(), {"max_batch_size": b, "max_queue_delay_ms": d}, scenario, seed, duration)
    res = oracle if policy_name == "oracle" else _simulate(batch.POLICIES[policy_name], dict(START), scenario, seed, duration)
    lat = res[0]
    return {"goodput_ratio": _good(res), "regret": 1.0 - _good(res) / max(1e-9, _good(oracle)),
            "p99_ms": float(np.quantile(np.where(np.isfinite(lat), lat, 1e9), 0.99) * 1e3)}
