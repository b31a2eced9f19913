"""Open-loop arrival streams: Poisson at a rate that changes each second, or gamma
inter-arrivals (bursty) at the same mean rate. Pure numpy; the seed fixes everything."""
from __future__ import annotations

import numpy as np


def poisson(rates: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Arrival times for a Poisson process whose rate is rates[s] during second s."""
    counts = rng.poisson(rates)
    starts = np.repeat(np.arange(len(rates), dtype=float), counts)
    return np.sort(starts + rng.random(starts.size))


def gamma_bursts(rates: np.ndarray, rng: np.random.Generator, shape: float = 0.2) -> np.ndarray:
    """Arrival times with gamma inter-arrivals (shape < 1 = bursty) following rates[s]."""
    out = []
    for second, rate in enumerate(rates):
        if rate <= 0:
            continue
        n = int(rate * 3) + 20
        gaps = rng.gamma(shape, 1.0 / (shape * rate), n)
        times = np.cumsum(gaps)
        out.append(second + times[times < 1.0])
    return np.concatenate(out) if out else np.zeros(0)


def profile(kind: str, duration: int, capacity: float) -> np.ndarray:
    """Offered load per second, in requests/s, for the named load shape."""
    t = np.arange(duration, dtype=float)
    third = duration // 3
    if kind == "step":  # 0.5C -> 1.5C -> 0.5C
        return np.where((t >= third) & (t < 2 * third), 1.5, 0.5) * capacity
    if kind == "ramp":  # 0.1C -> 2C
        return (0.1 + 1.9 * t / max(1, duration - 1)) * capacity
    if kind == "diurnal":  # one compressed day: 0.3C at night, 1.3C at the peak
        return (0.8 - 0.5 * np.cos(2 * np.pi * t / duration)) * capacity
    if kind == "steady":
        return np.full(duration, capacity)
    raise ValueError(f"unknown load profile {kind!r}; use step, ramp, diurnal or steady")
