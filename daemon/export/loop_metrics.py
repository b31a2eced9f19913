"""The daemon's own view for Prometheus, built at scrape time from its latest
state: per-service latency vs SLO and SLO-miss counters (for burn-rate
alerts), settings, decisions and rollbacks, attribution shares and drift.
(Collector and probe health come from daemon.export.samples.SampleExporter.)"""
from __future__ import annotations

import math
from collections import Counter

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from daemon.control.audit import Entry
from daemon.model.window import Window

QUANTILES = (0.5, 0.95, 0.99)


class DaemonMetrics:
    """Fed by the daemon once per window; read by prometheus_client at scrape time."""

    def __init__(self):
        self.latest: dict[str, Window] = {}
        self.requests: Counter = Counter()
        self.errors: Counter = Counter()
        self.slo_misses: Counter = Counter()
        self.decisions: Counter = Counter()
        self.settings: dict[tuple[str, str], float] = {}
        self.reachable: dict[str, bool] = {}
        self.attribution: dict[str, object] = {}
        self.drift: dict[tuple[str, str], tuple[float, bool]] = {}

    def observe_window(self, w: Window) -> None:
        self.latest[w.service] = w
        self.requests[w.service] += w.requests
        self.errors[w.service] += w.errors
        self.slo_misses[w.service] += w.requests * w.slo_miss_ratio

    def observe_decisions(self, entries: list[Entry]) -> None:
        for e in entries:
            self.decisions[(e.service, e.tuner, e.setting, e.outcome.label)] += 1

    def collect(self):
        lat = GaugeMetricFamily("slotune_service_latency_seconds",
                                "Latency quantile of the service over the last window", labels=["service", "quantile"])
        slo = GaugeMetricFamily("slotune_service_slo_seconds", "The service's P99 objective", labels=["service"])
        for name, w in self.latest.items():
            slo.add_metric([name], w.slo_p99_s)
            for q in QUANTILES:
                v = w.p(q)
                if math.isfinite(v):
                    lat.add_metric([name, str(q)], v)
        yield lat
        yield slo
        for metric, counter, text in (
                ("slotune_service_requests", self.requests, "Requests the service answered"),
                ("slotune_service_errors", self.errors, "Requests that ended in an error"),
                ("slotune_service_slo_misses", self.slo_misses, "Requests slower than the P99 objective")):
            fam = CounterMetricFamily(metric, text, labels=["service"])
            for name, v in counter.items():
                fam.add_metric([name], v)
            yield fam
        fam = GaugeMetricFamily("slotune_setting_value", "Current value of a tuned setting", labels=["service", "setting"])
        for (svc, setting), v in self.settings.items():
            fam.add_metric([svc, setting], v)
        yield fam
        fam = CounterMetricFamily("slotune_tuner_decisions", "Decisions by outcome",
                                  labels=["service", "tuner", "setting", "outcome"])
        for labels, n in self.decisions.items():
            fam.add_metric(list(labels), n)
        yield fam
        fam = GaugeMetricFamily("slotune_control_reachable", "1 when the service's control surface answers",
                                labels=["service"])
        for svc, ok in self.reachable.items():
            fam.add_metric([svc], 1.0 if ok else 0.0)
        yield fam
        yield from self._attribution()
        share = GaugeMetricFamily("slotune_drift_deviation_ratio", "Relative change against the baseline",
                                  labels=["service", "metric"])
        alert = GaugeMetricFamily("slotune_drift_alert", "1 while the drift detector signals a shift",
                                  labels=["service", "metric"])
        for (svc, metric), (dev, on) in self.drift.items():
            share.add_metric([svc, metric], dev)
            alert.add_metric([svc, metric], 1.0 if on else 0.0)
        yield share
        yield alert

    def _attribution(self):
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
        for svc, result in self.attribution.items():
            for cause, s in result.shares.items():
                share.add_metric([svc, cause], s)
            conf.add_metric([svc], result.confidence)
            excess.add_metric([svc], result.excess_s)
            growth.add_metric([svc], result.growth_s)
        yield share
        yield conf
        yield excess
        yield growth
