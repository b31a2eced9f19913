"""What a tuner's observation is built from: its Inputs, and the readings every
tuner's builder shares. Each tuner builds its own Observation in its module
(`observe(inputs)`, tuners/<name>.py); the generic signals come from the Window
(latency, rate, rejections, goodput), the rest from well-known metric families
a service may export (in flight, batches, traces kept, tool calls, breakers,
stage timings), found by name suffix, and the answers its latency histogram
labels by outcome."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable, Mapping

from slotune.config import ServiceConf
from slotune.model import labels
from slotune.model.columns import column
from slotune.model.histogram import add_into, merged
from slotune.model.interval import Span
from slotune.model.window import Window

MIN_REQUESTS = 5   # a window with fewer says little about a tail


def quantile(hist, q: float) -> float:
    """The histogram's q-quantile, 0 where there is none."""
    v = hist.quantile(q) if hist is not None else math.nan
    return v if math.isfinite(v) else 0.0


def _tail(w: Window) -> float:
    """The window's P99 where it timed enough requests to say one, else infinity."""
    p99 = w.p(0.99) if w.requests >= MIN_REQUESTS else math.nan
    return p99 if math.isfinite(p99) else math.inf


def queue_p99(windows: list[Window], history: list[Window], merged, lowest: float | None = None) -> float:
    """How long requests waited for their turn, at the tail: the service's own queue-wait
    histogram when it exports one, else P99 above the lowest P99 it showed lately (its
    no-load tail, as Vegas estimates queueing from RTT over the no-load RTT; `lowest`
    when the caller has it)."""
    own = family_hist(windows, "_queue_wait_seconds")
    if own is not None and own.count:
        return quantile(own, 0.99)
    if lowest is None:
        lowest = lowest_tail(history)
    if lowest == math.inf:
        return 0.0
    return max(0.0, quantile(merged, 0.99) - lowest)


def lowest_tail(history: list[Window]) -> float:
    """The lowest P99 the windows showed (infinity where none timed enough requests)."""
    return min(column(history, "queue tail", _tail), default=math.inf)


def family_hist(windows: list[Window], suffix: str):
    """The histograms of families ending in `suffix`, merged (None where there is none)."""
    return merged(h for w in windows for (fam, _), h in w.histograms.items() if fam.endswith(suffix))


@dataclass(frozen=True)
class Inputs:
    """What a tuner's observation is built from."""
    now: float
    recent: list[Window]          # the windows since the tuner's last decision
    history: list[Window]         # every window kept for the service
    conf: ServiceConf
    options: Mapping[str, float]  # the tuner's own config keys, defaults filled in
    interval_s: float
    baseline_for: Callable[[str, float, float], Any]   # (service, since, until) -> drift.Baseline | None
    recent_span: Span | None = None   # `recent` merged by the caller (the loop shares it with its guards)
    settings: Mapping[str, float] = field(default_factory=dict)   # the service's settings in force
    running: frozenset[str] = frozenset()   # the service's tuners still deciding (none stopped)
    # The proxy's windows over the same time, for a service throttled there (admission_by):
    # its clock starts when the proxy reads a request, so it holds the wait in the service's
    # accept queue and socket that the service's own clock, starting at its read, cannot see.
    admission_span: Span | None = None

    @cached_property
    def span(self) -> Span:
        return self.recent_span if self.recent_span is not None else Span(tuple(self.recent))

    @property
    def seconds(self) -> float:
        """The recent windows' length, never 0."""
        return max(sum(w.seconds for w in self.recent), 1e-9)

    def rate(self, count: Callable[[Window], float]) -> float:
        """count(window) summed over the recent windows, per second."""
        return sum(count(w) for w in self.recent) / self.seconds

    def tuner_option(self, tuner: str, name: str, default: float) -> float:
        """Another tuner's key as this service's config sets it (its default where unset)."""
        return next((t.options.get(name, default) for t in self.conf.tuners if t.name == tuner), default)

    def per_window(self, name: str, row: Callable[[Window], Any]) -> list[Any]:
        """row(window) for every window kept, each worked out once, when it is new
        (daemon/model/columns.py; `name` keys the cache)."""
        return column(self.history, name, row)

    # The shared readings, for the tuners' builders (tuners/ imports nothing of the daemon).
    quantile = staticmethod(quantile)

    def family_sum(self, suffix: str, windows: list[Window] | None = None, **wanted: str) -> float:
        """Sum of counter deltas (or histogram counts) of families ending in `suffix`, of the
        series whose labels have the wanted values (outcome="error"), over the recent windows."""
        total = 0.0
        for w in self.recent if windows is None else windows:
            for table in (w.counters, w.histograms):
                for (fam, label), v in table.items():
                    if fam.endswith(suffix) and all(labels.value(label, k) == want for k, want in wanted.items()):
                        total += v if isinstance(v, float) else v.count
        return total

    def family_hist(self, suffix: str, windows: list[Window] | None = None):
        return family_hist(self.recent if windows is None else windows, suffix)

    def by_label(self, suffix: str, key: str) -> dict[str, Any]:
        """The recent histograms of families ending in `suffix`, merged per value of label `key`."""
        out: dict[str, Any] = {}
        for w in self.recent:
            for (fam, label), h in w.histograms.items():
                value = labels.value(label, key)
                if fam.endswith(suffix) and value is not None:
                    add_into(out, value, h)
        return out

    def gauge_max(self, suffix: str) -> float | None:
        values = [v for w in self.recent for (fam, _), v in w.gauges.items() if fam.endswith(suffix)]
        return max(values) if values else None

    def gauge_last(self, suffix: str) -> list[float]:
        """The last recent window's values of gauges ending in `suffix`."""
        return [v for (fam, _), v in (self.recent[-1].gauges.items() if self.recent else ()) if fam.endswith(suffix)]

    def gauge_mean(self, suffix: str) -> float:
        """A gauge's mean over the recent windows that carry it, its series added in each (0 when none does)."""
        per_window = [sum(v for (fam, _), v in w.gauges.items() if fam.endswith(suffix)) for w in self.recent
                      if any(fam.endswith(suffix) for fam, _ in w.gauges)]
        return sum(per_window) / len(per_window) if per_window else 0.0

    def queue_p99(self, windows: list[Window] | None = None, latency=None, lowest: float | None = None) -> float:
        """queue_p99() of the recent windows (or of `windows`, whose merged latency is `latency`)."""
        if windows is None:
            windows, latency = self.recent, self.span.latency
        return queue_p99(windows, self.history, latency, lowest)

    def lowest_tail(self) -> float:
        return lowest_tail(self.history)

    def answers_labelled(self, w: Window, key: str, value: str) -> float:
        """Answers the window's latency histogram (the service's latency_metric) labels key=value."""
        return sum(h.count for (fam, label), h in w.histograms.items()
                   if fam == self.conf.spec.latency_metric and labels.value(label, key) == value)
