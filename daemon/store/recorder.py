"""What the daemon keeps of each service for the long run: every RECORD_EVERY_S
one point per metric (P50, P99, throughput, error ratio) into the baseline
store, pruned to the retention, and the P99 history read back as the drift
tuner's baseline: from the local store, or with `baseline_source =
"prometheus"` from Prometheus (the local store answering while Prometheus
does not, said once). A store that fails (disk full, locked, corrupt) costs
those points, counted and said once per kind; the daemon goes on. It exports
slotune_deploy_info, the labels that keep a baseline's deploy id and
environment in Prometheus."""
from __future__ import annotations

import logging
import math
import socket
import sqlite3
from collections import Counter
from typing import Callable

import numpy as np
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from slotune.tuners import drift

from slotune.model.interval import Interval
from slotune.store.baselines import BaselineStore
from slotune.store.prometheus_history import (DEPLOY_INFO, PrometheusError, PrometheusHistory, history_query,
                                             label_value)

log = logging.getLogger(__name__)
RECORD_EVERY_S = 10.0            # one baseline point per service and metric this often
PRUNE_EVERY_S = 3600.0
DRIFT_METRIC = drift.METRIC      # what baselines are kept of: the drift tuner's metric
STORE_ERRORS = (sqlite3.Error, OSError, ValueError)
# Reading the baseline from Prometheus runs on the loop's thread, in interval time:
PROMETHEUS_STEP_S = 60.0      # one baseline point per minute (7 days: 10 080 points, two queries)
PROMETHEUS_TIMEOUT_S = 5.0    # a Prometheus that hangs costs a tick at most this long ...
PROMETHEUS_RETRY_S = 60.0     # ... and is asked again only this long after it failed (the local store answers)
PROMETHEUS_REFRESH_S = 300.0  # a service's baseline from Prometheus is kept this long (7 days barely move)


def error_kind(exc: BaseException) -> str:
    """A short, bounded name for what went wrong: "database is locked", "disk I/O error", ..."""
    text = str(exc).split(":")[0].strip().lower()
    return text[:60] or type(exc).__name__


class BaselineRecorder:
    """Also a prometheus_client collector: slotune_baseline_store_errors_total{kind} and
    slotune_deploy_info{host, environment, deploy_id}. `running_config()` is the daemon's
    config, read at each baseline so that a reload that changes daemon.baseline_source
    applies; without it the local store answers alone."""

    def __init__(self, store: BaselineStore, environment: str, deploy_id: str, retention_days: float = 35.0,
                 running_config: Callable | None = None):
        self.store, self.environment, self.deploy_id = store, environment, deploy_id
        self.retention_s = retention_days * 86400.0
        self.last_t = 0.0
        self.last_prune_t = -math.inf
        self.errors: Counter = Counter()
        self.running_config, self.host = running_config, socket.gethostname()
        self.from_prometheus: dict[str, tuple] = {}   # service -> ((url, environment), until, Baseline | None)
        self.prometheus_retry_at = -math.inf
        self.prometheus_down = False
        self.said_empty: set[str] = set()

    def record(self, interval: Interval, services: list[str], guard=lambda service, rows: rows()) -> None:
        """One row per service and metric when RECORD_EVERY_S has passed since the last;
        guard(service, rows) runs each service's rows() (the daemon's bulkhead: None if it failed)."""
        now = interval.end
        if now - self.last_t < RECORD_EVERY_S:
            return
        self.last_t = now
        rows: list = []
        for service in services:
            rows += guard(service, lambda service=service: self._rows(interval, service, now)) or []
        if rows:
            self._guarded("record", lambda: self.store.record_many(rows))
        if now - self.last_prune_t >= PRUNE_EVERY_S:
            self.last_prune_t = now
            self._guarded("prune", lambda: self.store.prune(now - self.retention_s))

    def _rows(self, interval: Interval, service: str, now: float) -> list[tuple]:
        span = interval.since(service, now - RECORD_EVERY_S)
        if not span.requests:
            return []
        errors = sum(w.errors for w in span.windows)
        values = {"latency_p50_seconds": span.quantile(0.5), DRIFT_METRIC: span.p99,
                  "throughput_rps": span.requests / span.seconds,
                  "error_ratio": errors / max(span.requests, 1)}
        return [(service, m, v, now, self.environment, self.deploy_id) for m, v in values.items() if math.isfinite(v)]

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
        """The P99 history of this environment (every deploy) as the drift tuner's baseline: from
        Prometheus when the config says so and it answers with one, else from the local store."""
        cfg = self.running_config() if self.running_config else None
        if cfg is not None and cfg.baseline_source == "prometheus":
            found = self._prometheus_baseline(cfg.prometheus_url, service, since, until)
            if found is not None:
                return found
        values = self._guarded("read", lambda: self.store.values(service, DRIFT_METRIC, self.environment,
                                                                 since=since, until=until))
        return None if values is None else summary(values)

    def _prometheus_baseline(self, url: str, service: str, since: float, until: float) -> drift.Baseline | None:
        """The host's P99 history in Prometheus, asked again every PROMETHEUS_REFRESH_S; None while
        Prometheus fails (said once until it answers again) or holds too little (said once per service)."""
        if until <= since:
            return None
        cached, key = self.from_prometheus.get(service), (url, self.environment)
        if cached and cached[0] == key and 0 <= until - cached[1] < PROMETHEUS_REFRESH_S:
            return cached[2]
        if until < self.prometheus_retry_at:
            return None
        query = history_query(DRIFT_METRIC, service, self.host, self.environment, PROMETHEUS_STEP_S)
        try:
            deploys = PrometheusHistory(url, PROMETHEUS_TIMEOUT_S).by_deploy(query, since, until, PROMETHEUS_STEP_S)
        except PrometheusError as exc:
            if not self.prometheus_down:
                log.warning("baseline source: %s; the drift tuner reads its baseline from the local store %s "
                            "meanwhile (Prometheus is asked again every %.0f s; said once until it answers)",
                            exc, self.store.path, PROMETHEUS_RETRY_S)
            self.prometheus_down, self.prometheus_retry_at = True, until + PROMETHEUS_RETRY_S
            return None
        if self.prometheus_down:
            log.info("baseline source: Prometheus at %s answers again; the drift tuner reads its baseline "
                     "from there", url)
            self.prometheus_down = False
        points = sorted(p for series in deploys.values() for p in series)
        found = summary(np.array([v for _, v in points]))
        if found is None and service not in self.said_empty:
            self.said_empty.add(service)
            log.warning("baseline source: Prometheus at %s holds too little %s history for service %s (query %s); "
                        "the local store answers for it. Fix: let Prometheus scrape this host's daemon "
                        "(%s{host=%s}), or fill the local store with `slotune baseline import` (said once)",
                        url, DRIFT_METRIC, service, query, DEPLOY_INFO, label_value(self.host))
        self.from_prometheus[service] = (key, until, found)
        return found

    def collect(self):
        fam = CounterMetricFamily("slotune_baseline_store_errors", "Baseline store operations that failed, by kind",
                                  labels=["kind"])
        for kind, n in sorted(self.errors.items()):
            fam.add_metric([kind], n)
        yield fam
        info = GaugeMetricFamily(DEPLOY_INFO, "The environment and deploy id this host's baselines are kept "
                                 "under (always 1); join on instance to label the other slotune_ series",
                                 labels=["host", "environment", "deploy_id"])
        info.add_metric([self.host, self.environment, self.deploy_id], 1.0)
        yield info


def summary(values: np.ndarray) -> drift.Baseline | None:
    """Per-window values in time order as the drift tuner's baseline; None below 3 windows."""
    if len(values) < 3:
        return None
    return drift.Baseline(mean=float(values.mean()), std=float(values.std(ddof=1)), windows=len(values),
                          samples=tuple(float(v) for v in values[-500:]), robust_std=drift.robust_std(values))
