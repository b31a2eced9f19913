"""The control loop's view for Prometheus, built at scrape time from the last
tick: per-service latency (and TTFT/TPOT) vs SLO and SLO-miss counters (for
burn-rate alerts), settings, decisions and rollbacks, attribution shares and drift.
(Collector and probe health come from slotune.export.samples.SampleExporter.)"""
from __future__ import annotations

import math
import threading
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from slotune.store.audit import Entry
from slotune.model.window import Window

if TYPE_CHECKING:
    from slotune.attribution.explain import Explanation

QUANTILES = (0.5, 0.95, 0.99)


@dataclass(frozen=True)
class LoopView:
    """What the loop shows after one tick, handed over whole so that a scrape never
    sees half of a tick: the setting in force, as read back from each control surface."""
    settings: dict[tuple[str, str], float] = field(default_factory=dict)     # (service, setting) -> value
    reachable: dict[str, bool] = field(default_factory=dict)
    attribution: dict[str, Explanation] = field(default_factory=dict)
    drift: dict[tuple[str, str], tuple[float, bool]] = field(default_factory=dict)
    rollbacks_owed: set[tuple[str, str]] = field(default_factory=set)        # (service, setting)
    audit_failures: int = 0


class LoopMetrics:
    """Fed by the daemon once per tick (observe); read by prometheus_client at scrape
    time (collect), which works on a copy taken under the lock."""

    def __init__(self):
        self._lock = threading.Lock()
        self.latest: dict[str, Window] = {}
        self.requests: Counter[str] = Counter()
        # A service's own error counter, and requests times a share: fractional counts.
        self.errors: dict[str, float] = defaultdict(float)
        self.slo_misses: dict[str, float] = defaultdict(float)
        self.ttft_misses: dict[str, float] = defaultdict(float)
        self.tpot_misses: dict[str, float] = defaultdict(float)
        self.decisions: Counter[tuple[str, str, str, str]] = Counter()
        self.view = LoopView()
        self.tick_s, self.late_ticks = 0.0, 0    # the last tick's length; ticks longer than the interval

    @property
    def attribution(self) -> dict[str, Explanation]:
        return self.view.attribution

    def observe(self, windows: list[Window], entries: list[Entry], view: LoopView) -> None:
        with self._lock:
            for w in windows:
                self.latest[w.service] = w
                self.requests[w.service] += w.requests
                self.errors[w.service] += w.errors
                self.slo_misses[w.service] += w.requests * w.slo_miss_ratio
                if w.slo_ttft_s:
                    self.ttft_misses[w.service] += w.requests * w.ttft_miss_ratio
                if w.slo_tpot_s:
                    self.tpot_misses[w.service] += w.requests * w.tpot_miss_ratio
            for e in entries:
                self.decisions[(e.service, e.tuner, e.setting, e.outcome.label)] += 1
            self.view = view

    def ticked(self, seconds: float, interval_s: float) -> None:
        with self._lock:
            self.tick_s = seconds
            self.late_ticks += seconds > interval_s

    def collect(self):
        with self._lock:
            tick_s, late = self.tick_s, self.late_ticks
            latest, view = dict(self.latest), self.view
            counters = [dict(c) for c in (self.requests, self.errors, self.slo_misses,
                                             self.ttft_misses, self.tpot_misses)]
            decisions = Counter(self.decisions)
        yield from _families(latest, counters, decisions, view)
        yield GaugeMetricFamily("slotune_tick_duration_seconds", "How long the last tick took (collect, "
                                "attribute, decide, push, export)", value=tick_s)
        yield CounterMetricFamily("slotune_ticks_late", "Ticks that took longer than collect_interval_s "
                                  "(the next one starts at once)", value=late)


def _token_families(latest: dict[str, Window]):
    """Time to first token and time per output token against their objectives, for the
    services that stream tokens."""
    for what, text in (("ttft", "time to first token"), ("tpot", "time per output token")):
        q = GaugeMetricFamily(f"slotune_service_{what}_seconds", f"The service's {text}, quantile over the last window",
                              labels=["service", "quantile"])
        slo = GaugeMetricFamily(f"slotune_service_{what}_slo_seconds", f"The service's P99 objective for {text}",
                                labels=["service"])
        for name, w in latest.items():
            hist, objective = getattr(w, what), getattr(w, f"slo_{what}_s")
            if objective:
                slo.add_metric([name], objective)
            for quantile in QUANTILES if hist is not None and hist.count else ():
                v = hist.quantile(quantile)
                if math.isfinite(v):
                    q.add_metric([name, str(quantile)], v)
        yield q
        yield slo


def _families(latest, counters, decisions, view: LoopView):
    lat = GaugeMetricFamily("slotune_service_latency_seconds",
                            "Latency quantile of the service over the last window", labels=["service", "quantile"])
    slo = GaugeMetricFamily("slotune_service_slo_seconds", "The service's P99 objective", labels=["service"])
    for name, w in latest.items():
        slo.add_metric([name], w.slo_p99_s)
        for q in QUANTILES:
            v = w.p(q)
            if math.isfinite(v):
                lat.add_metric([name, str(q)], v)
    yield lat
    yield slo
    yield from _token_families(latest)
    requests, errors, slo_misses, ttft_misses, tpot_misses = counters
    for metric, counter, text in (
            ("slotune_service_requests", requests, "Requests the service answered"),
            ("slotune_service_errors", errors, "Requests that ended in an error"),
            ("slotune_service_slo_misses", slo_misses, "Requests slower than the P99 objective"),
            ("slotune_service_ttft_slo_misses", ttft_misses, "Requests whose first token came later than the TTFT objective"),
            ("slotune_service_tpot_slo_misses", tpot_misses,
             "Requests slower per output token than the TPOT objective (the share of slow gaps between tokens)")):
        fam = CounterMetricFamily(metric, text, labels=["service"])
        for name, v in counter.items():
            fam.add_metric([name], v)
        yield fam
    setting_value = GaugeMetricFamily("slotune_setting_value", "Current value of a tuned setting",
                                      labels=["service", "setting"])
    for (svc, setting), v in view.settings.items():
        setting_value.add_metric([svc, setting], v)
    yield setting_value
    fam = CounterMetricFamily("slotune_tuner_decisions", "Decisions by outcome",
                              labels=["service", "tuner", "setting", "outcome"])
    for labels, n in decisions.items():
        fam.add_metric(list(labels), n)
    yield fam
    reachable = GaugeMetricFamily("slotune_control_reachable", "1 when the service's control surface answers",
                                  labels=["service"])
    for svc, ok in view.reachable.items():
        reachable.add_metric([svc], 1.0 if ok else 0.0)
    yield reachable
    yield from _attribution(view.attribution)
    share = GaugeMetricFamily("slotune_drift_deviation_ratio", "Relative change against the baseline",
                              labels=["service", "metric"])
    alert = GaugeMetricFamily("slotune_drift_alert", "1 while the drift detector signals a shift",
                              labels=["service", "metric"])
    for (svc, metric), (dev, on) in view.drift.items():
        share.add_metric([svc, metric], dev)
        alert.add_metric([svc, metric], 1.0 if on else 0.0)
    yield share
    yield alert
    owed = GaugeMetricFamily("slotune_rollback_failed", "1 while a rollback of the setting has not landed "
                             "(retried with back-off until it does)", labels=["service", "setting"])
    for svc, setting in sorted(view.rollbacks_owed):
        owed.add_metric([svc, setting], 1.0)
    yield owed
    yield CounterMetricFamily("slotune_audit_write_failures", "Decisions not pushed because the audit log "
                              "could not be written", value=view.audit_failures)

def _attribution(attribution: dict):
    share = GaugeMetricFamily("slotune_attribution_share_ratio",
                              "Share of the latency growth over the service's baseline explained by each cause",
                              labels=["service", "cause"])
    conf = GaugeMetricFamily("slotune_attribution_confidence_ratio", "Confidence of the attribution",
                             labels=["service"])
    excess = GaugeMetricFamily("slotune_attribution_excess_seconds", "P99 minus P50 over the attribution horizon",
                               labels=["service"])
    growth = GaugeMetricFamily("slotune_attribution_growth_seconds",
                               "How far the service's P99 (or P50, when every request slowed) moved over its "
                               "baseline: what the shares split", labels=["service"])
    for svc, result in attribution.items():
        for cause, s in result.shares.items():
            share.add_metric([svc, cause], s)
        conf.add_metric([svc], result.confidence)
        excess.add_metric([svc], result.excess_s)
        growth.add_metric([svc], result.growth_s)
    yield share
    yield conf
    yield excess
    yield growth
