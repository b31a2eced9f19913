"""Turns a service's recent Windows into the Observation each tuner reads.
Generic signals come from the Window (latency, rate, rejections, goodput);
the rest from well-known metric families a service may export (in flight,
batches, traces kept, tool calls, breakers), found by name suffix."""
from __future__ import annotations

import math
from dataclasses import dataclass

from tuners import batch, breaker, drift, sampling, throttle

from daemon.config import ServiceConf
from daemon.model.window import Window, merged_latency

MIN_REQUESTS = 5   # a window with fewer says little about a tail


@dataclass(frozen=True)
class Context:
    """What some observations need beyond the windows: the baseline store's view."""
    baseline: drift.Baseline | None = None


def _q(hist, q: float) -> float:
    v = hist.quantile(q) if hist is not None else math.nan
    return v if math.isfinite(v) else 0.0


def _seconds(windows: list[Window]) -> float:
    return max(sum(w.seconds for w in windows), 1e-9)


def _family_sum(windows: list[Window], suffix: str, label_has: str = "") -> float:
    """Sum of counter deltas (or histogram counts) of families ending in `suffix`."""
    total = 0.0
    for w in windows:
        for table in (w.counters, w.histograms):
            for (fam, label), v in table.items():
                if fam.endswith(suffix) and label_has in label:
                    total += v if isinstance(v, float) else v.count
    return total


def _gauge_max(windows: list[Window], suffix: str) -> float | None:
    values = [v for w in windows for (fam, _), v in w.gauges.items() if fam.endswith(suffix)]
    return max(values) if values else None


def _family_hist(windows: list[Window], suffix: str):
    hist = None
    for w in windows:
        for (fam, _), h in w.histograms.items():
            if fam.endswith(suffix):
                hist = h if hist is None else hist.plus(h)
    return hist


def queue_p99(windows: list[Window], history: list[Window]) -> float:
    """How long requests waited for their turn, at the tail: the service's own queue-wait
    histogram when it exports one, else P99 above the lowest P99 it showed lately (its
    no-load tail, as Vegas estimates queueing from RTT over the no-load RTT)."""
    own = _family_hist(windows, "_queue_wait_seconds")
    if own is not None and own.count:
        return _q(own, 0.99)
    tails = [w.p(0.99) for w in history if w.requests >= MIN_REQUESTS and math.isfinite(w.p(0.99))]
    if not tails:
        return 0.0
    return max(0.0, _q(merged_latency(windows), 0.99) - min(tails))


def for_throttle(now, windows, conf: ServiceConf, history: list[Window]) -> throttle.Observation:
    hist, secs = merged_latency(windows), _seconds(windows)
    completed = sum(w.requests for w in windows) / secs
    in_flight = _gauge_max(windows, "_inflight_requests")
    if in_flight is None:  # Little's law when the service does not say
        in_flight = completed * (hist.mean() if hist is not None and hist.count else 0.0)
    return throttle.Observation(
        now=now, slo_s=conf.spec.slo_p99_s, p50_s=_q(hist, 0.5), p90_s=_q(hist, 0.9), p99_s=_q(hist, 0.99),
        arrival_rps=sum(w.requests + w.rejected for w in windows) / secs, completed_rps=completed,
        goodput_rps=sum(w.goodput * w.seconds for w in windows) / secs,
        rejected_rps=sum(w.rejected for w in windows) / secs, in_flight=float(in_flight),
        queue_p99_s=queue_p99(windows, history))


def for_batch(now, windows, conf: ServiceConf) -> batch.Observation:
    hist, secs = merged_latency(windows), _seconds(windows)
    return batch.Observation(
        now=now, slo_s=conf.spec.slo_p99_s, p99_s=_q(hist, 0.99),
        arrival_rps=sum(w.requests + w.rejected for w in windows) / secs,
        goodput_rps=sum(w.goodput * w.seconds for w in windows) / secs, batches=batches_run(windows))


def batches_run(windows: list[Window]) -> tuple[tuple[int, int, float], ...]:
    """(mean batch size, batches, mean compute s) per window: the batch time is linear in
    the size, so a window's mean compute sits on the fit at its mean size, and windows
    of different sizes let the tuner see both the slope and the scatter around it."""
    out = []
    for w in windows:
        sizes, compute = _family_hist([w], "_batch_size"), _family_hist([w], "_batch_compute_seconds")
        if sizes is not None and compute is not None and sizes.count and compute.count:
            out.append((max(1, round(sizes.mean())), compute.count, compute.mean()))
    return tuple(out)


def for_sampling(now, windows, conf: ServiceConf, budget_per_s: float) -> sampling.Observation:
    hist, secs = merged_latency(windows), _seconds(windows)
    return sampling.Observation(
        now=now, request_rps=sum(w.requests for w in windows) / secs,
        error_rps=sum(w.errors for w in windows) / secs, p90_s=_q(hist, 0.9), p99_s=_q(hist, 0.99),
        kept_rps=_family_sum(windows, "_traces_total", "sampled=true") / secs,
        budget_traces_per_s=budget_per_s)


def for_breaker(now, windows, conf: ServiceConf, slo_failure_rate: float) -> breaker.Observation:
    calls = _family_sum(windows, "_tool_calls_total")
    failures = _family_sum(windows, "_tool_calls_total", "outcome=error")
    open_now = [v for (fam, _), v in (windows[-1].gauges.items() if windows else ()) if fam.endswith("_breaker_open")]
    return breaker.Observation(now=now, calls=int(calls), failures=int(failures),
                               breaker_open=any(v > 0 for v in open_now), slo_failure_rate=slo_failure_rate)


def for_drift(now, windows, ctx: Context) -> drift.Observation | None:
    """The P99 of the interval against the stored baseline; None until a baseline exists."""
    hist = merged_latency(windows)
    if ctx.baseline is None or hist is None or not hist.count:
        return None
    samples = tuple(w.p(0.99) for w in windows if w.requests and math.isfinite(w.p(0.99)))
    return drift.Observation(now=now, value=_q(hist, 0.99), baseline=ctx.baseline, samples=samples)
