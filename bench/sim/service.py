"""A service with FIFO queue and `workers` parallel workers, heavy-tailed (lognormal)
service times, and a limiter in front (concurrency limit and/or token-bucket rate limit)
whose settings a throttle policy retunes every INTERVAL_S from 1-second windows; and
optionally a dimmer that answers a share of the admitted requests degraded (for
`degraded_cost` of the service time: no tool calls, fewer tokens), whose ratio a degrade
policy retunes at the same time from the same windows. With `batch` > 1 the answers run
in batches as long as their longest answer: a degraded answer saves its work only when
its batch-mates are degraded too (each is, with the ratio's chance)."""
from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from slotune.tuners import degrade, throttle


@dataclass(frozen=True)
class ServiceModel:
    workers: int
    median_s: float        # lognormal service-time median
    sigma: float           # lognormal shape (1-1.5 = heavy tail)
    slo_s: float
    degraded_cost: float = 1.0   # a degraded answer's service time, as a share of a full one's
    batch: int = 1               # answers run together, each batch as long as its longest answer

    @property
    def mean_s(self) -> float:
        return self.median_s * float(np.exp(self.sigma ** 2 / 2))

    @property
    def capacity_rps(self) -> float:
        return self.workers / self.mean_s


def quantiles(lat: np.ndarray) -> tuple[float, float, float]:
    if lat.size == 0:
        return 0.0, 0.0, 0.0
    q = np.quantile(lat, (0.5, 0.9, 0.99))
    return float(q[0]), float(q[1]), float(q[2])


def run(policy, model: ServiceModel, arrivals: np.ndarray, slowdown: np.ndarray,
        settings: dict[str, float], rng: np.random.Generator, duration: int, dimmer=None):
    """Simulate; returns per-second arrays (goodput, p99, setting; with a dimmer, the
    degraded answers, those within the SLO and the ratio too) and totals."""
    service = rng.lognormal(np.log(model.median_s), model.sigma, arrivals.size)
    batch_rng = np.random.default_rng(rng.integers(1 << 32))
    busy: list[tuple[int, degrade.Busy]] = []     # (second, what it carried) of each busy second
    worth = settings.get("degraded_worth", degrade.WORTH)
    state = policy.initial_state(settings)
    ratio = settings.get(degrade.SETTING, 0.0)
    dim_state = dimmer.initial_state(settings) if dimmer is not None else None
    owed = 0.0   # the gateway's pick: a request is degraded each time the ratio adds up to one more
    limit = settings.get("concurrency_limit", float("inf"))
    rate = settings.get("rate_limit_rps", float("inf"))
    tokens, last_t = (0.0 if rate != float("inf") else 1.0), 0.0
    free = [0.0] * model.workers
    in_flight: list[float] = []
    done = [[] for _ in range(duration + 64)]
    dimmed = [[] for _ in range(duration + 64)]
    waits = [[] for _ in range(duration + 64)]
    offered = np.zeros(duration)
    rejected = np.zeros(duration)
    peak = np.zeros(duration)
    setting_trace = np.zeros(duration)
    p99s = np.zeros(duration)
    good = np.zeros(duration)
    degraded = np.zeros(duration)
    good_degraded = np.zeros(duration)
    ratio_trace = np.zeros(duration)
    tick = 1
    heappush, heappop = heapq.heappush, heapq.heappop
    n = arrivals.size
    i = 0
    while tick <= duration:
        # admit every arrival before the tick
        while i < n and arrivals[i] < tick:
            t = arrivals[i]
            sec = int(t)
            offered[sec] += 1
            while in_flight and in_flight[0] <= t:
                heappop(in_flight)
            if rate != float("inf"):
                tokens = min(max(1.0, rate * 0.1), tokens + (t - last_t) * rate)
            last_t = t
            if len(in_flight) >= limit or tokens < 1.0:
                rejected[sec] += 1
            else:
                if rate != float("inf"):
                    tokens -= 1.0
                owed += ratio
                dim = owed >= 1.0 - 1e-9
                owed -= dim
                cheap = dim and (model.batch == 1 or batch_rng.random() < ratio ** (model.batch - 1))
                start = max(t, heappop(free))
                finish = start + service[i] * slowdown[min(sec, duration - 1)] * (model.degraded_cost if cheap else 1.0)
                heappush(free, finish)
                heappush(in_flight, finish)
                if len(in_flight) > peak[sec]:
                    peak[sec] = len(in_flight)
                done[min(int(finish), duration + 63)].append(finish - t)
                dimmed[min(int(finish), duration + 63)].append(dim)
                waits[min(int(finish), duration + 63)].append(start - t)
            i += 1
        w = tick - 1
        lat = np.asarray(done[w])
        p50, p90, p99 = quantiles(lat)
        p99s[w] = p99
        good[w] = np.count_nonzero(lat <= model.slo_s)
        dim = np.asarray(dimmed[w], bool)
        degraded[w] = np.count_nonzero(dim)
        good_degraded[w] = np.count_nonzero(dim & (lat <= model.slo_s))
        queue_p99 = quantiles(np.asarray(waits[w]))[2]
        verdict = degrade.Verdict()
        load = float(offered[max(0, w + 1 - int(degrade.LOAD_S)):w + 1].mean())   # the dimmer's smoothed load
        if dimmer is not None:
            if lat.size:
                busy.append((w, degrade.Busy(float(lat.size), degraded[w], offered[w], rejected[w] > 0,
                                             queue_p99 > degrade.queue_budget(model.slo_s, p99, queue_p99))))
            verdict = degrade.verdict([b for s, b in busy if s > w - degrade.EVIDENCE_S], worth)
        if tick % int(throttle.INTERVAL_S) == 0:
            obs = throttle.Observation(now=float(tick), slo_s=model.slo_s, p50_s=p50, p90_s=p90, p99_s=p99,
                                       arrival_rps=offered[w], completed_rps=float(lat.size), goodput_rps=good[w],
                                       rejected_rps=rejected[w], in_flight=max(peak[w], len(in_flight)),
                                       queue_p99_s=queue_p99,
                                       degrade_room=dimmer is not None and degrade.has_room(ratio, verdict, load, worth))
            state, decision = policy.decide(state, obs)
            limit = decision.changes.get("concurrency_limit", limit)
            rate = decision.changes.get("rate_limit_rps", rate)
        if dimmer is not None and tick % int(degrade.INTERVAL_S) == 0:
            obs = degrade.Observation(now=float(tick), slo_s=model.slo_s, p99_s=p99, arrival_rps=offered[w],
                                      completed_rps=float(lat.size), degraded_rps=degraded[w],
                                      refused_rps=rejected[w], queue_p99_s=queue_p99, verdict=verdict,
                                      worth=worth, load_rps=load)
            dim_state, decision = dimmer.decide(dim_state, obs)
            ratio = decision.changes.get(degrade.SETTING, ratio)
        setting_trace[w] = limit if limit != float("inf") else rate
        ratio_trace[w] = ratio
        tick += 1
    return {"goodput": good, "p99": p99s, "offered": offered, "setting": setting_trace, "rejected": rejected,
            "degraded": degraded, "good_degraded": good_degraded, "ratio": ratio_trace}
