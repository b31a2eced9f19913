"""What the daemon keeps of each service for the long run: every RECORD_EVERY_S
one point per metric (P50, P99, throughput, error ratio) into the baseline
store, pruned to the retention, and the stored P99 history read back as the
drift tuner's baseline. A store that fails (disk full, locked, corrupt) costs
those points, counted and said once per kind; the daemon goes on."""
from __future__ import annotations

import logging
import math
import sqlite3
from collections import Counter

from prometheus_client.core import CounterMetricFamily
from tuners import drift

from daemon.model.interval import Interval
from daemon.store.baselines import BaselineStore

log = logging.getLogger(__name__)
RECORD_EVERY_S = 10.0            # one baseline point per service and metric this often
PRUNE_EVERY_S = 3600.0
DRIFT_METRIC = "latency_p99_seconds"
STORE_ERRORS = (sqlite3.Error, OSError, ValueError)


def error_kind(exc: BaseException) -> str:
    """A short, bounded name for what went wrong: "database is locked", "disk I/O error", ..."""
    text = str(exc).split(":")[0].strip().lower()
    return text[:60] or type(exc).__name__


class BaselineRecorder:
    """Also a prometheus_client collector: slotune_baseline_store_errors_total{kind}."""

    def __init__(self, store: BaselineStore, environment: str, deploy_id: str, retention_days: float = 35.0):
        self.store, self.environment, self.deploy_id = store, environment, deploy_id
        self.retention_s = retention_days * 86400.0
        self.last_t = 0.0
        self.last_prune_t = -math.inf
        self.errors: Counter = Counter()

    def record(self, interval: Interval, services: list[str]) -> None:
        """One row per service and metric when RECORD_EVERY_S has passed since the last."""
        now = interval.end
        if now - self.last_t < RECORD_EVERY_S:
            return
        self.last_t = now
        rows = []
        for service in services:
            span = interval.since(service, now - RECORD_EVERY_S)
            if not span.requests:
                continue
            errors = sum(w.errors for w in span.windows)
            values = {"latency_p50_seconds": span.quantile(0.5), DRIFT_METRIC: span.p99,
                      "throughput_rps": span.requests / span.seconds,
                      "error_ratio": errors / max(span.requests, 1)}
            rows += [(service, m, v, now, self.environment, self.deploy_id)
                     for m, v in values.items() if math.isfinite(v)]
        if rows:
            self._guarded("record", lambda: self.store.record_many(rows))
        if now - self.last_prune_t >= PRUNE_EVERY_S:
            self.last_prune_t = now
            self._guarded("prune", lambda: self.store.prune(now - self.retention_s))

    def _guarded(self, what: str, op):
        """op()'s result, or None when the store failed (said once per kind, counted)."""
        try:
            return op()
        except STORE_ERRORS as exc:
            kind = error_kind(exc)
            if not self.errors[kind]:
                log.error("baseline store %s: %s failed (%s); these points are lost and the daemon goes on "
                          "(said once; counted in slotune_baseline_store_errors_total). Fix: free space or "
                          "permissions there, or set daemon.baseline_store to another path", self.store.path,
                          what, exc)
            self.errors[kind] += 1
            return None

    def baseline(self, service: str, since: float, until: float) -> drift.Baseline | None:
        """The stored P99 history of this environment (every deploy) as the drift tuner's baseline."""
        values = self._guarded("read", lambda: self.store.values(service, DRIFT_METRIC, self.environment,
                                                                 since=since, until=until))
        if values is None or len(values) < 3:
            return None
        return drift.Baseline(mean=float(values.mean()), std=float(values.std(ddof=1)), windows=len(values),
                              samples=tuple(float(v) for v in values[-500:]), robust_std=drift.robust_std(values))

    def collect(self):
        fam = CounterMetricFamily("slotune_baseline_store_errors", "Baseline store operations that failed, by kind",
                                  labels=["kind"])
        for kind, n in sorted(self.errors.items()):
            fam.add_metric([kind], n)
        yield fam
