"""A dynamic batcher in front of `instances` model instances sharing one queue: a batch
leaves when max_batch_size requests are queued or the oldest has waited max_queue_delay;
a batch of b takes (a + c*b) * lognormal noise. A batch policy retunes it every INTERVAL_S."""
from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from slotune.tuners import batch


@dataclass(frozen=True)
class BatchModel:
    a_s: float
    c_s: float
    noise_sigma: float
    slo_s: float
    instances: int = 2

    def capacity_rps(self, size: float) -> float:
        return self.instances * size / (self.a_s + self.c_s * size)


def run(policy, model: BatchModel, arrivals: np.ndarray, slowdown: np.ndarray, settings: dict[str, float],
        rng: np.random.Generator, duration: int):
    state = policy.initial_state(settings)
    size, delay = int(settings["max_batch_size"]), settings["max_queue_delay_ms"] / 1e3
    noise_mean = float(np.exp(model.noise_sigma ** 2 / 2))
    free = [0.0] * model.instances
    n = arrivals.size
    latency = np.full(n, np.inf)
    i = 0
    interval = batch.INTERVAL_S
    next_tick = interval
    window_batches: dict[int, list[float]] = {}
    offered = np.histogram(arrivals, bins=np.arange(duration + 1))[0]
    while i < n or next_tick <= duration:
        t_free = free[0]
        dispatch = np.inf
        if i < n:
            start = max(t_free, arrivals[i])
            full = arrivals[i + size - 1] if i + size - 1 < n else np.inf
            dispatch = max(start, min(arrivals[i] + delay, full))
        if next_tick <= min(dispatch, duration + 1e-9):  # control tick before the next batch leaves
            lo = int(next_tick - interval)
            done = latency[np.searchsorted(arrivals, lo):np.searchsorted(arrivals, next_tick)]
            done = done[np.isfinite(done)]
            obs = batch.Observation(now=next_tick, slo_s=model.slo_s,
                                    p99_s=float(np.quantile(done, 0.99)) if done.size else 0.0,
                                    arrival_rps=float(offered[lo:int(next_tick)].sum() / interval),
                                    goodput_rps=float(np.count_nonzero(done <= model.slo_s) / interval),
                                    batches=tuple((b, len(ts), float(np.mean(ts))) for b, ts in sorted(window_batches.items())))
            state, decision = policy.decide(state, obs)
            size = int(decision.changes.get("max_batch_size", size))
            delay = decision.changes.get("max_queue_delay_ms", delay * 1e3) / 1e3
            window_batches = {}
            next_tick += interval
            continue
        if i >= n:
            break
        j = min(i + size, int(np.searchsorted(arrivals, dispatch, side="right")))
        b = j - i
        compute = (model.a_s + model.c_s * b) * rng.lognormal(0.0, model.noise_sigma) / noise_mean
        compute *= slowdown[min(int(dispatch), duration - 1)]
        finish = dispatch + compute
        latency[i:j] = finish - arrivals[i:j]
        window_batches.setdefault(b, []).append(compute)
        heapq.heapreplace(free, finish)
        i = j
    return latency
