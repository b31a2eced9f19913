"""Prometheus export of collector Samples: a prometheus_client custom collector
that adds every Sample's deltas into cumulative families at observe() time and
builds real histograms (_bucket/_sum/_count on export_bounds(): by default every
edge of the kernel's slots), counters and gauges at scrape time; histograms() hands
the same histograms, slot by slot, to the OTLP export. Which signal becomes which
metric is the SIGNALS table: the rows each collector adds with register_signals()
(the kernel collector its probe families' signals, in collectors/kernel/families/;
the GPU collector its own)."""
from __future__ import annotations

import logging
import re
import threading
from typing import NamedTuple

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from slotune.model import labels as series_labels
from slotune.model.sample import Sample
from slotune.model.histogram import Histogram, add_into, export_bounds

log = logging.getLogger(__name__)

KINDS = ("histogram", "counter", "gauge")


class Signal(NamedTuple):
    metric: str              # full metric name, e.g. slotune_tcp_rtt_seconds
    label: str | None        # name of the label the Sample key's label goes into, or None
    kind: str                # "histogram" (Sample.histograms), "counter" (counters), "gauge" (gauges)
    help: str


SIGNALS: dict[str, Signal] = {}


def labels(row: Signal, service: str, label: str) -> dict[str, str]:
    """A series' labels: its service, and its signal's own label where it has one; a label in
    model/labels.py's key() form holds several (the http family's route beside its status)."""
    if "=" in label:
        return {"service": service, **series_labels.parse(label)}
    return {"service": service, **({row.label: label} if row.label else {})}


def register_signals(table: dict[str, Signal | tuple]) -> None:
    """Add signal name -> (metric, label, kind, help) rows; a clash or a bad name is refused."""
    for signal, row in table.items():
        row = Signal(*row)
        if row.kind not in KINDS:
            raise ValueError(f"signal {signal!r}: kind {row.kind!r} is not one of {', '.join(KINDS)}")
        if not re.fullmatch(r"slotune_[a-z0-9_]+", row.metric):
            raise ValueError(f"signal {signal!r}: metric {row.metric!r} must be slotune_<lowercase_name>")
        if (row.kind == "counter") != row.metric.endswith("_total"):
            raise ValueError(f"signal {signal!r}: counters, and only counters, end in _total ({row.metric})")
        taken = {r.metric: s for s, r in SIGNALS.items()}
        if taken.get(row.metric, signal) != signal or SIGNALS.get(signal, row) != row:
            raise ValueError(f"signal {signal!r} / metric {row.metric!r} is already registered differently")
        SIGNALS[signal] = row


class SampleExporter:
    """Register with a CollectorRegistry; feed it with observe(samples) each interval."""

    def __init__(self, bounds_s: tuple[float, ...] | None = None):
        self.bounds_s = bounds_s or export_bounds()    # [export] buckets_per_octave
        self._lock = threading.Lock()
        self._hists: dict[tuple[str, str, str], Histogram] = {}
        self._counters: dict[tuple[str, str, str], float] = {}
        self._gauges: dict[tuple[str, str, str], float] = {}
        self._up: dict[str, bool] = {}
        self._probes: dict[str, bool] = {}
        self._unknown: set[str] = set()

    def observe(self, samples: list[Sample]) -> None:
        with self._lock:
            for s in samples:
                for (signal, label), h in s.histograms.items():
                    if self._known(signal, "histogram"):
                        key = (signal, s.service, label)
                        add_into(self._hists, key, h)
                for (signal, label), v in s.counters.items():
                    if self._known(signal, "counter"):
                        key = (signal, s.service, label)
                        self._counters[key] = self._counters.get(key, 0.0) + v
                for (signal, label), v in s.gauges.items():
                    if self._known(signal, "gauge"):
                        self._gauges[(signal, s.service, label)] = v

    def _known(self, signal: str, kind: str) -> bool:
        row = SIGNALS.get(signal)
        if row is not None and row.kind == kind:
            return True
        if signal not in self._unknown:
            self._unknown.add(signal)
            log.warning("signal %r (%s) has no metric in slotune.export.samples.SIGNALS; not exported "
                        "(add it with register_signals)", signal, kind)
        return False

    def set_collector_up(self, collector: str, up: bool) -> None:
        with self._lock:
            self._up[collector] = bool(up)

    def set_probes(self, attached: dict[str, bool]) -> None:
        """probe name -> attached; replaces what a collector reported before for those probes."""
        with self._lock:
            self._probes.update(attached)

    def histograms(self) -> list[tuple[str, Signal, dict[str, str], Histogram]]:
        """Each histogram series as it stands: (signal, its row, its labels, its cumulative slots)."""
        with self._lock:
            hists = dict(self._hists)      # each Histogram is replaced as it grows, never changed
        return [(signal, SIGNALS[signal], labels(SIGNALS[signal], service, label), h)
                for (signal, service, label), h in sorted(hists.items())]

    def collect(self):
        with self._lock:
            hists, counters, gauges = dict(self._hists), dict(self._counters), dict(self._gauges)
            up, probes = dict(self._up), dict(self._probes)
        families = {}
        names: dict[str, dict[str, None]] = {}      # each family's label names: any of its series has them
        for signal, service, label in (*hists, *counters, *gauges):
            row = SIGNALS[signal]
            names.setdefault(signal, dict.fromkeys(labels(row, "", ""))).update(dict.fromkeys(labels(row, service, label)))

        def family(signal):
            row = SIGNALS[signal]
            if signal not in families:
                cls = {"histogram": HistogramMetricFamily, "counter": CounterMetricFamily,
                       "gauge": GaugeMetricFamily}[row.kind]
                families[signal] = cls(row.metric, row.help, labels=list(names[signal]))
            return families[signal]

        def values(signal, service, label):    # "" where this series lacks one (Prometheus: no label)
            own = labels(SIGNALS[signal], service, label)
            return [own.get(name, "") for name in names[signal]]

        for (signal, service, label), h in sorted(hists.items()):
            family(signal).add_metric(values(signal, service, label), buckets=h.prometheus_buckets(self.bounds_s),
                                      sum_value=h.total_ns / 1e9)
        for (signal, service, label), v in sorted(counters.items()):
            family(signal).add_metric(values(signal, service, label), v)
        for (signal, service, label), v in sorted(gauges.items()):
            family(signal).add_metric(values(signal, service, label), v)
        yield from families.values()
        if up:
            fam = GaugeMetricFamily("slotune_collector_up", "1 when the collector runs", labels=["collector"])
            for name, ok in sorted(up.items()):
                fam.add_metric([name], 1.0 if ok else 0.0)
            yield fam
        if probes:
            fam = GaugeMetricFamily("slotune_probe_attached",
                                    "1 when the kernel probe is attached, 0 when it failed to attach",
                                    labels=["probe"])
            for name, ok in sorted(probes.items()):
                fam.add_metric([name], 1.0 if ok else 0.0)
            yield fam
