"""Turns a service's recent Windows into the Observation each tuner reads.
Generic signals come from the Window (latency, rate, rejections, goodput);
the rest from well-known metric families a service may export (in flight,
batches, traces kept, tool calls, breakers, stage timings), found by name
suffix, and the degraded answers its latency histogram labels. Each builder takes the same Inputs; daemon.control.tuner_specs names
them, and the settings a budget decision means."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable, Mapping

from tuners import batch, breaker, budget, continuous_batch, degrade, drift, sampling, throttle

from daemon.config import ServiceConf
from daemon.model import labels
from daemon.model.histogram import add_into, merged
from daemon.model.columns import column
from daemon.model.interval import Span
from daemon.model.window import Window

MIN_REQUESTS = 5   # a window with fewer says little about a tail
DEGRADED_OUTCOME = "degraded"   # the outcome label of an answer given degraded (still a 200)


@dataclass(frozen=True)
class Inputs:
    """What a tuner's observation is built from."""
    now: float
    recent: list[Window]          # the windows since the tuner's last decision
    history: list[Window]         # every window kept for the service
    conf: ServiceConf
    options: Mapping[str, float]  # the tuner's own config keys, defaults filled in
    interval_s: float
    baseline_for: Callable[[str, float, float], drift.Baseline | None]   # (service, since, until)
    recent_span: Span | None = None   # `recent` merged by the caller (the loop shares it with its guards)
    settings: Mapping[str, float] = field(default_factory=dict)   # the service's settings in force
    running: frozenset[str] = frozenset()   # the service's tuners still deciding (none stopped)

    @cached_property
    def span(self) -> Span:
        return self.recent_span if self.recent_span is not None else Span(tuple(self.recent))


def _q(hist, q: float) -> float:
    v = hist.quantile(q) if hist is not None else math.nan
    return v if math.isfinite(v) else 0.0


def _seconds(windows: list[Window]) -> float:
    return max(sum(w.seconds for w in windows), 1e-9)


def _family_sum(windows: list[Window], suffix: str, **wanted: str) -> float:
    """Sum of counter deltas (or histogram counts) of families ending in `suffix`, of the
    series whose labels have the wanted values (outcome="error")."""
    total = 0.0
    for w in windows:
        for table in (w.counters, w.histograms):
            for (fam, label), v in table.items():
                if fam.endswith(suffix) and all(labels.value(label, k) == want for k, want in wanted.items()):
                    total += v if isinstance(v, float) else v.count
    return total


def _gauge_max(windows: list[Window], suffix: str) -> float | None:
    values = [v for w in windows for (fam, _), v in w.gauges.items() if fam.endswith(suffix)]
    return max(values) if values else None


def _family_hist(windows: list[Window], suffix: str):
    return merged(h for w in windows for (fam, _), h in w.histograms.items() if fam.endswith(suffix))


def queue_p99(windows: list[Window], history: list[Window], merged, lowest: float | None = None) -> float:
    """How long requests waited for their turn, at the tail: the service's own queue-wait
    histogram when it exports one, else P99 above the lowest P99 it showed lately (its
    no-load tail, as Vegas estimates queueing from RTT over the no-load RTT; `lowest`
    when the caller has it)."""
    own = _family_hist(windows, "_queue_wait_seconds")
    if own is not None and own.count:
        return _q(own, 0.99)
    if lowest is None:
        lowest = min(column(history, "queue tail", _tail), default=math.inf)
    if lowest == math.inf:
        return 0.0
    return max(0.0, _q(merged, 0.99) - lowest)


def _tail(w: Window) -> float:
    """The window's P99 where it timed enough requests to say one, else infinity."""
    p99 = w.p(0.99) if w.requests >= MIN_REQUESTS else math.nan
    return p99 if math.isfinite(p99) else math.inf


def _degraded(w: Window, latency_metric: str) -> float:
    """Answers the window's latency histogram labels outcome="degraded"."""
    return sum(h.count for (fam, label), h in w.histograms.items()
               if fam == latency_metric and labels.value(label, "outcome") == DEGRADED_OUTCOME)


def dimmer_verdict(i: Inputs) -> degrade.Verdict:
    """Whether degrading pays on this service (tuners/degrade.py verdict), from its windows
    of the last EVIDENCE_S: what each carried, how much of it degraded, whether the
    limiter refused and whether its queue wait was over the dimmer's budget. Each
    window's row is worked out once, when it is new (daemon/model/columns.py)."""
    slo, metric = i.conf.spec.slo_p99_s, i.conf.spec.latency_metric
    lowest = min(column(i.history, "queue tail", _tail), default=math.inf)

    def row(w: Window) -> degrade.Busy | None:
        if not w.requests or not w.seconds:
            return None
        queue = queue_p99([w], [], w.latency, lowest)
        return degrade.Busy(w.requests / w.seconds, _degraded(w, metric) / w.seconds,
                            (w.requests + w.rejected) / w.seconds, w.rejected > 0,
                            queue > degrade.queue_budget(slo, _q(w.latency, 0.99), queue))
    rows = column(i.history, "dimmer evidence", row)
    since = i.now - degrade.EVIDENCE_S
    worth = next((t.options.get("degraded_worth", degrade.WORTH) for t in i.conf.tuners if t.name == "degrade"),
                 degrade.WORTH)
    return degrade.verdict([r for w, r in zip(i.history, rows) if r is not None and w.end > since], worth)


def for_throttle(i: Inputs) -> throttle.Observation:
    windows = i.recent
    hist, secs = i.span.latency, _seconds(windows)
    completed = sum(w.requests for w in windows) / secs
    in_flight = _gauge_max(windows, "_inflight_requests")
    if in_flight is None:  # Little's law when the service does not say
        in_flight = completed * (hist.mean() if hist is not None and hist.count else 0.0)
    return throttle.Observation(
        now=i.now, slo_s=i.conf.spec.slo_p99_s, p50_s=_q(hist, 0.5), p90_s=_q(hist, 0.9), p99_s=_q(hist, 0.99),
        arrival_rps=sum(w.requests + w.rejected for w in windows) / secs, completed_rps=completed,
        goodput_rps=sum(w.goodput * w.seconds for w in windows) / secs,
        rejected_rps=sum(w.rejected for w in windows) / secs, in_flight=float(in_flight),
        queue_p99_s=queue_p99(windows, i.history, hist), degrade_room=_degrade_room(i))


def _degrade_room(i: Inputs) -> bool:
    """A dimmer beside the throttle can still degrade more, and it pays: the throttle lets it go first."""
    if "degrade" not in i.running or i.settings.get(degrade.SETTING, 1.0) >= 1.0:
        return False
    verdict = dimmer_verdict(i)
    return verdict.pays is not False


def for_degrade(i: Inputs) -> degrade.Observation:
    """The throttle's view of the interval plus the answers given degraded: those the
    service's latency histogram labels outcome="degraded" (the dimmer's, and those a
    failed tool degraded)."""
    windows = i.recent
    hist, secs = i.span.latency, _seconds(windows)
    degraded = sum(_degraded(w, i.conf.spec.latency_metric) for w in windows)
    return degrade.Observation(
        now=i.now, slo_s=i.conf.spec.slo_p99_s, p99_s=_q(hist, 0.99),
        arrival_rps=sum(w.requests + w.rejected for w in windows) / secs,
        completed_rps=sum(w.requests for w in windows) / secs, degraded_rps=degraded / secs,
        refused_rps=sum(w.rejected for w in windows) / secs, queue_p99_s=queue_p99(windows, i.history, hist),
        verdict=dimmer_verdict(i))


def for_batch(i: Inputs) -> batch.Observation:
    windows = i.recent
    hist, secs = i.span.latency, _seconds(windows)
    return batch.Observation(
        now=i.now, slo_s=i.conf.spec.slo_p99_s, p99_s=_q(hist, 0.99),
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


def _gauge_mean(windows: list[Window], suffix: str) -> float:
    """A gauge's mean over the windows that carry it, its series added in each (0 when none does)."""
    per_window = [sum(v for (fam, _), v in w.gauges.items() if fam.endswith(suffix)) for w in windows
                  if any(fam.endswith(suffix) for fam, _ in w.gauges)]
    return sum(per_window) / len(per_window) if per_window else 0.0


def for_continuous_batch(i: Inputs) -> continuous_batch.Observation:
    """An LLM server's token latencies (the windows' TTFT, one per request, and gaps between
    output tokens, one per gap) and its scheduler's signals: running and waiting sequences,
    KV cache use, preemptions, tokens per step (daemon/profiles names them per product)."""
    windows = i.recent
    ttft, gaps, steps = i.span.ttft, i.span.tpot, _family_hist(windows, "_iteration_tokens")
    return continuous_batch.Observation(
        now=i.now, slo_ttft_s=i.conf.spec.slo_ttft_p99_s, slo_tpot_s=i.conf.spec.slo_tpot_p99_s,
        ttft_p99_s=_q(ttft, 0.99), tpot_p99_s=_q(gaps, 0.99),
        itl_mean_s=gaps.mean() if gaps is not None and gaps.count else 0.0,
        requests=int(ttft.count) if ttft is not None else 0,
        running=_gauge_mean(windows, "_num_requests_running"), waiting=_gauge_mean(windows, "_num_requests_waiting"),
        kv_usage=_gauge_max(windows, "_kv_cache_usage_ratio") or 0.0,
        preemptions=_family_sum(windows, "_num_preemptions_total"),
        step_tokens=steps.mean() if steps is not None and steps.count else 0.0, step_tokens_p99=_q(steps, 0.99))


def for_sampling(i: Inputs) -> sampling.Observation:
    windows = i.recent
    hist, secs = i.span.latency, _seconds(windows)
    return sampling.Observation(
        now=i.now, request_rps=sum(w.requests for w in windows) / secs,
        error_rps=sum(w.errors for w in windows) / secs, p90_s=_q(hist, 0.9), p99_s=_q(hist, 0.99),
        kept_rps=_family_sum(windows, "_traces_total", sampled="true") / secs,
        budget_traces_per_s=i.options["budget_traces_per_s"])


def for_breaker(i: Inputs) -> breaker.Observation:
    windows = i.recent
    calls = _family_sum(windows, "_tool_calls_total")
    failures = _family_sum(windows, "_tool_calls_total", outcome="error")
    open_now = [v for (fam, _), v in (windows[-1].gauges.items() if windows else ()) if fam.endswith("_breaker_open")]
    return breaker.Observation(now=i.now, calls=int(calls), failures=int(failures),
                               breaker_open=any(v > 0 for v in open_now),
                               slo_failure_rate=i.options["slo_failure_rate"])


def for_drift(i: Inputs) -> drift.Observation | None:
    """The P99 of the interval against the stored baseline (the days before the interval);
    None until a baseline exists."""
    hist = i.span.latency
    baseline = i.baseline_for(i.conf.name, i.now - i.options["baseline_days"] * 86400.0, i.now - i.interval_s)
    if baseline is None or hist is None or not hist.count:
        return None
    samples = tuple(w.p(0.99) for w in i.recent if w.requests and math.isfinite(w.p(0.99)))
    return drift.Observation(now=i.now, value=_q(hist, 0.99), baseline=baseline, samples=samples)


def _stages(windows: list[Window]) -> dict[str, object]:
    out: dict[str, object] = {}
    for w in windows:
        for (fam, label), h in w.histograms.items():
            stage = labels.value(label, "stage")
            if fam.endswith("_stage_duration_seconds") and stage is not None:
                add_into(out, stage, h)
    return out


def for_budget(i: Inputs) -> budget.Observation:
    """Each hop's P50 and P99 over the interval (0: no calls, the tuner waits for data); the
    own hop's are the sums of its stages' (as if its stages were slow together)."""
    stages = _stages(i.recent)
    measured = {stage for stage, _ in budget.HOPS.values()}
    own = [h for stage, h in stages.items() if stage not in measured]
    quantiles = {budget.OWN_HOP: (sum(_q(h, 0.5) for h in own), sum(_q(h, 0.99) for h in own))}
    quantiles |= {hop: (_q(stages.get(stage), 0.5), _q(stages.get(stage), 0.99))
                  for hop, (stage, _) in budget.HOPS.items()}
    return budget.Observation(
        now=i.now, slo_s=i.conf.spec.slo_p99_s,
        hop_slos_s=tuple((hop, i.options[f"{hop}_slo_ms"] / 1000.0) for hop in quantiles),
        hop_p50_s=tuple((hop, p50) for hop, (p50, _) in quantiles.items()),
        hop_p99_s=tuple((hop, p99) for hop, (_, p99) in quantiles.items()))


def budget_timeouts(changes: dict[str, float], i: Inputs) -> dict[str, float]:
    """The budget tuner's weights as the timeouts that enforce them: weight x the service's
    P99 SLO, in ms. The own hop's weight stays free for the gateway's own work."""
    slo_ms = i.conf.spec.slo_p99_s * 1000.0
    return {setting: changes[budget.PREFIX + hop] * slo_ms
            for hop, (_, setting) in budget.HOPS.items() if budget.PREFIX + hop in changes}
