"""Where decisions (and, over OTLP, metrics) go besides /metrics: the sinks [export] names,
each fed off the control loop's thread through a bounded queue that one thread drains.
A full queue drops, a failed send is counted (slotune_export_*_total{sink}) and said once
in the log until the sink works again; nothing here blocks the loop or raises into it."""
from __future__ import annotations

import logging
import threading
from collections import Counter, deque
from typing import Callable

from prometheus_client.core import CounterMetricFamily

from slotune.store.audit import Entry, Outcome

log = logging.getLogger(__name__)
# The decisions operators are shown: what slotune changed, undid, failed to undo, or would not do.
SHOWN = frozenset({Outcome.PUSHED, Outcome.ROLLED_BACK, Outcome.ROLLBACK_FAILED, Outcome.REFUSED})
QUEUE_ITEMS = 1000
CLOSE_WAIT_S = 2.0


def shown(entries: list[Entry]) -> list[Entry]:
    return [e for e in entries if e.outcome in SHOWN]


class ExportCounters:
    """slotune_export_{sent,dropped,failed}_total{sink}, a prometheus_client collector."""

    def __init__(self):
        self._lock = threading.Lock()
        self.counts: dict[str, Counter[str]] = {"sent": Counter(), "dropped": Counter(), "failed": Counter()}

    def add(self, what: str, sink: str, n: int) -> None:
        with self._lock:
            self.counts[what][sink] += n

    def collect(self):
        helps = {"sent": "Items a sink delivered (decisions, or metric snapshots over OTLP)",
                 "dropped": "Items dropped because the sink's queue was full (it is slower than the decisions)",
                 "failed": "Items whose send failed (the sink was down or refused them); not retried"}
        with self._lock:
            counts = {what: Counter(c) for what, c in self.counts.items()}
        for what, counter in counts.items():
            fam = CounterMetricFamily(f"slotune_export_{what}", helps[what], labels=["sink"])
            for sink, n in sorted(counter.items()):
                fam.add_metric([sink], n)
            yield fam


class Outbox:
    """A bounded queue for one sink, drained by its own thread into send(batch)."""

    def __init__(self, sink: str, where: str, send: Callable[[list], None], counters: ExportCounters,
                 batch: int = 100, capacity: int = QUEUE_ITEMS):
        self.sink, self.where, self.send, self.counters = sink, where, send, counters
        self.batch, self.capacity = batch, capacity
        self.queue: deque = deque()
        self.cond = threading.Condition()
        self.closing = False
        self.failing = self.said_full = False
        self.thread = threading.Thread(target=self._run, name=f"export-{sink}", daemon=True)
        self.thread.start()

    def offer(self, items: list) -> None:
        """Queue what fits, drop the rest (counted); never waits."""
        if not items:
            return
        with self.cond:
            room = max(self.capacity - len(self.queue), 0)
            self.queue.extend(items[:room])
            self.cond.notify()
        dropped = len(items) - min(room, len(items))
        if dropped:
            if not self.said_full:
                self.said_full = True
                log.warning("export %s (%s): queue full, %d item(s) dropped; counted in "
                            "slotune_export_dropped_total{sink=%r} (said once)", self.sink, self.where, dropped,
                            self.sink)
            self.counters.add("dropped", self.sink, dropped)

    def _run(self) -> None:
        while True:
            with self.cond:
                while not self.queue and not self.closing:
                    self.cond.wait()
                if not self.queue:
                    return
                batch = [self.queue.popleft() for _ in range(min(self.batch, len(self.queue)))]
            try:
                self.send(batch)
            except Exception as exc:     # a sink's failure is its own: said once, counted
                if not self.failing:     # said first: whoever sees the count finds the line
                    log.warning("export %s to %s failed (%s); what it should have received is dropped and "
                                "counted in slotune_export_failed_total{sink=%r}; the control loop goes on "
                                "(said once until it works again)", self.sink, self.where, exc, self.sink)
                self.failing = True
                self.counters.add("failed", self.sink, len(batch))
                continue
            self.counters.add("sent", self.sink, len(batch))
            if self.failing:
                self.failing = False
                log.info("export %s to %s works again", self.sink, self.where)

    def close(self, wait_s: float = CLOSE_WAIT_S) -> None:
        """Send what is queued for up to wait_s; what is left then is dropped (counted)."""
        with self.cond:
            self.closing = True
            self.cond.notify()
        self.thread.join(wait_s)
        with self.cond:
            left = len(self.queue)
            self.queue.clear()
        if left:
            self.counters.add("dropped", self.sink, left)


class Sinks:
    """The configured sinks as one: decided(entries) and tick(now) from the loop, close() at exit."""

    def __init__(self, sinks: list, counters: ExportCounters):
        self.sinks, self.counters = sinks, counters

    def decided(self, entries: list[Entry]) -> None:
        entries = shown(entries)
        for s in self.sinks:
            s.decided(entries)

    def tick(self, now: float) -> None:
        for s in self.sinks:
            s.tick(now)

    def close(self) -> None:
        for s in self.sinks:
            s.close()


def start(cfg, registry, latencies) -> Sinks:
    """The sinks cfg.export names, their counters registered in the daemon's registry; latencies
    (the SampleExporter) gives OTLP its histograms slot by slot."""
    from slotune.export import annotations, otlp    # they build on Outbox, above
    counters = ExportCounters()
    registry.register(counters)
    out: list[annotations.GrafanaAnnotations | otlp.OtlpExport] = []
    conf = cfg.export
    if conf.grafana_url:
        out.append(annotations.GrafanaAnnotations(conf.grafana_url, conf.grafana_token_file,
                                                  conf.grafana_dashboard_uid, counters))
    if conf.otlp_endpoint:
        sink = otlp.start(conf, cfg.environment, registry, latencies, counters)
        if sink is not None:
            out.append(sink)
    return Sinks(out, counters)
