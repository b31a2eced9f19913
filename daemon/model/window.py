"""One time-aligned record per service per collection interval: every
collector's Sample for that service merged, plus the service's end-to-end
latency taken from its own histogram when configured, else from eBPF."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from daemon.collectors.base import Key, Sample
from daemon.model.histogram import BucketHistogram, Histogram

EBPF_LATENCY: Key = ("http_request", "")
ERROR_OUTCOMES = ("error",)
REJECTED_OUTCOMES = ("rejected",)


@dataclass
class Window:
    service: str
    start: float
    end: float
    slo_p99_s: float
    latency: Histogram | BucketHistogram | None = None
    latency_source: str = ""          # "service" (its own histogram) | "ebpf" | ""
    errors: float = 0.0
    rejected: float = 0.0
    histograms: dict[Key, Histogram | BucketHistogram] = field(default_factory=dict)
    counters: dict[Key, float] = field(default_factory=dict)
    gauges: dict[Key, float] = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        return max(self.end - self.start, 1e-9)

    @property
    def requests(self) -> int:
        return self.latency.count if self.latency is not None else 0

    @property
    def rate(self) -> float:
        return self.requests / self.seconds

    def p(self, q: float) -> float:
        return self.latency.quantile(q) if self.latency is not None else math.nan

    @property
    def slo_miss_ratio(self) -> float:
        return self.latency.fraction_above(self.slo_p99_s) if self.latency is not None else 0.0

    @property
    def goodput(self) -> float:
        """Requests per second that answered within the SLO and without error."""
        good = self.requests * (1.0 - self.slo_miss_ratio) - self.errors
        return max(good, 0.0) / self.seconds

    @property
    def error_ratio(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    def family(self, name: str) -> dict[str, Histogram | BucketHistogram | float]:
        """Everything under one metric family, by label string."""
        found: dict[str, object] = {}
        for table in (self.histograms, self.counters, self.gauges):
            found.update({label: v for (fam, label), v in table.items() if fam == name})
        return found


def _outcome(label: str) -> str | None:
    for part in label.split(","):
        if part.startswith("outcome="):
            return part[len("outcome="):]
    return None


def build(service: str, slo_p99_s: float, start: float, end: float, samples: list[Sample],
          latency_metric: str = "") -> Window:
    """Merge one service's samples for one interval into a Window."""
    w = Window(service, start, end, slo_p99_s)
    for s in samples:
        for key, h in s.histograms.items():
            w.histograms[key] = w.histograms[key].plus(h) if key in w.histograms else h
        for key, v in s.counters.items():
            w.counters[key] = w.counters.get(key, 0.0) + v
        w.gauges.update(s.gauges)
    if latency_metric:
        by_label = {label: h for (fam, label), h in w.histograms.items() if fam == latency_metric}
        served = [h for label, h in by_label.items() if _outcome(label) not in REJECTED_OUTCOMES]
        if served:
            w.latency = served[0]
            for h in served[1:]:
                w.latency = w.latency.plus(h)
            w.latency_source = "service"
        w.errors = sum(h.count for label, h in by_label.items() if _outcome(label) in ERROR_OUTCOMES)
        w.rejected = sum(h.count for label, h in by_label.items() if _outcome(label) in REJECTED_OUTCOMES)
    if w.latency is None and EBPF_LATENCY in w.histograms:
        w.latency, w.latency_source = w.histograms[EBPF_LATENCY], "ebpf"
    return w


def merged_latency(windows: list[Window]) -> Histogram | BucketHistogram | None:
    """The latency of several windows together. A service's latency can come from
    its own histogram in one window and from eBPF in another (a missed scrape);
    only windows with the most recent source are merged, as the two do not add."""
    source = next((w.latency_source for w in reversed(windows) if w.latency is not None), None)
    merged = None
    for w in windows:
        if w.latency is not None and w.latency_source == source:
            merged = w.latency if merged is None else merged.plus(w.latency)
    return merged
