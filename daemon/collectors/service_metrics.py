"""Reads a service's own Prometheus /metrics each interval and turns it into
deltas: every histogram becomes a BucketHistogram, every counter a delta and
every gauge a last value, keyed (family, "label=value,...")."""
from __future__ import annotations

import logging
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from daemon.model.sample import Key, Sample
from daemon.model import labels
from daemon.model.histogram import BucketHistogram
from daemon.model.service import ServiceSpec

log = logging.getLogger(__name__)


def parse(text: str) -> tuple[dict[Key, BucketHistogram], dict[Key, float], dict[Key, float]]:
    """Cumulative histograms, counters (monotonic totals) and gauges from exposition text."""
    buckets: dict[Key, list[tuple[float, float]]] = {}
    sums: dict[Key, float] = {}
    counters: dict[Key, float] = {}
    gauges: dict[Key, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = (family.name, labels.key(s.labels))
            if family.type == "histogram":
                if s.name.endswith("_bucket"):
                    buckets.setdefault(key, []).append((float(s.labels["le"]), s.value))
                elif s.name.endswith("_sum"):
                    sums[key] = s.value
            elif family.type == "counter" and s.name.endswith("_total"):
                counters[key] = s.value
            elif family.type == "gauge":
                gauges[key] = s.value
    hists = {k: BucketHistogram.from_cumulative(v, sums.get(k, 0.0)) for k, v in buckets.items()}
    return hists, counters, gauges


class ServiceMetricsCollector:
    """One scrape per service per interval; a service that does not answer is
    reported once (and again when it comes back) and yields no sample."""
    name = "service_metrics"

    def __init__(self, timeout_s: float = 0.8):
        self.urls: dict[str, str] = {}      # service -> its metrics_url
        self.timeout_s = timeout_s
        self.previous: dict[str, tuple[dict, dict]] = {}
        self.failing: set[str] = set()

    exports_samples = False    # the services export these series themselves

    @property
    def up(self) -> bool:
        return True

    def parts(self) -> dict[str, bool]:
        return {}

    def metric_families(self):
        return ()

    def start(self, services: list[ServiceSpec]) -> None:
        self.update_services(services)

    def update_services(self, services: list[ServiceSpec]) -> None:
        self.urls = {s.name: s.metrics_url for s in services if s.metrics_url}

    def scrape(self, service: str, url: str):
        try:
            with urllib.request.urlopen(url, timeout=self.timeout_s) as resp:
                text = resp.read().decode()
        except OSError as exc:
            if service not in self.failing:
                log.warning("service %s: cannot read its metrics at %s (%s); will retry each interval",
                            service, url, exc)
                self.failing.add(service)
            return None
        if service in self.failing:
            log.info("service %s: metrics at %s answer again", service, url)
            self.failing.discard(service)
        return parse(text)

    def collect(self, start: float, end: float) -> list[Sample]:
        out = []
        for service, url in self.urls.items():
            parsed = self.scrape(service, url)
            if parsed is None:
                continue
            hists, counters, gauges = parsed
            before = self.previous.get(service)
            self.previous[service] = (hists, counters)
            if before is None:
                continue  # the first read only sets the starting point
            prev_h, prev_c = before
            sample = Sample(service, self.name, start, end, gauges=gauges)
            sample.histograms = {k: h.minus(prev_h[k]) if k in prev_h else h for k, h in hists.items()}
            sample.counters = {k: v - prev_c.get(k, 0.0) if v >= prev_c.get(k, 0.0) else v
                               for k, v in counters.items()}
            out.append(sample)
        return out

    def close(self) -> None:
        pass
