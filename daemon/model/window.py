"""One time-aligned record per service per collection interval: every
collector's Sample for that service merged, plus the service's end-to-end
latency taken from its own histogram when configured, else from eBPF.
A Window is built once and never changed after: later stages share it."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from daemon.model import labels
from daemon.model.histogram import BucketHistogram, Histogram
from daemon.model.sample import Key, Sample

EBPF_LATENCY: Key = ("http_request", "")
ERROR_OUTCOMES = ("error",)
REJECTED_OUTCOMES = ("rejected",)


@dataclass(frozen=True, eq=False)   # one per service per interval: it is its own identity
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



def build(service: str, slo_p99_s: float, start: float, end: float, samples: list[Sample],
          latency_metric: str = "") -> Window:
    """Merge one service's samples for one interval into a Window."""
    histograms: dict[Key, Histogram | BucketHistogram] = {}
    counters: dict[Key, float] = {}
    gauges: dict[Key, float] = {}
    for s in samples:
        for key, h in s.histograms.items():
            histograms[key] = histograms[key].plus(h) if key in histograms else h
        for key, v in s.counters.items():
            counters[key] = counters.get(key, 0.0) + v
        gauges.update(s.gauges)
    latency, source, errors, rejected = None, "", 0.0, 0.0
    if latency_metric:
        by_outcome = [(labels.value(label, "outcome"), h) for (fam, label), h in histograms.items()
                      if fam == latency_metric]
        for outcome, h in by_outcome:
            if outcome not in REJECTED_OUTCOMES:
                latency, source = (h if latency is None else latency.plus(h)), "service"
        errors = sum(h.count for outcome, h in by_outcome if outcome in ERROR_OUTCOMES)
        rejected = sum(h.count for outcome, h in by_outcome if outcome in REJECTED_OUTCOMES)
    if latency is None and EBPF_LATENCY in histograms:
        latency, source = histograms[EBPF_LATENCY], "ebpf"
    return Window(service, start, end, slo_p99_s, latency, source, errors, rejected, histograms, counters, gauges)


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
