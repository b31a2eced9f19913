"""Prometheus as a history source for baselines: PromQL for each baseline metric
of one service on one host, labelled with the deploy id and environment that
the host's daemon exports in slotune_deploy_info, run over /api/v1/query_range
and copied into the baseline store, so a fleet can keep Prometheus as its
store of record (`slotune baseline import`, and the daemon's
`baseline_source = "prometheus"`)."""
from __future__ import annotations

import http.client
import math
import re
import time
from urllib.parse import urlencode

from slotune.host.http_exchange import TooLarge, exchange
from slotune.host.untrusted import Untrusted, json_value

MAX_POINTS = 10_000  # Prometheus refuses more than 11 000 points per series in one query
MAX_ANSWER_BYTES = 8 << 20   # one chunk's answer: a full series is ~0.4 MB, so room for a range's deploys
DETAIL_CHARS = 200           # of Prometheus' error, quoted in the message
METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
DEPLOY_INFO = "slotune_deploy_info"   # {host, environment, deploy_id} 1, exported by each daemon
# The store's metrics as the daemon exports them, one value per step for one service:
# {sel} is the service's label matcher, {w} the step (the daemon's per-window P99 gauge
# averaged over the step; request and error counters as rates over the step).
STORE_METRICS = {
    "latency_p50_seconds": 'avg_over_time(slotune_service_latency_seconds{{{sel},quantile="0.5"}}[{w}])',
    "latency_p99_seconds": 'avg_over_time(slotune_service_latency_seconds{{{sel},quantile="0.99"}}[{w}])',
    "throughput_rps": "rate(slotune_service_requests_total{{{sel}}}[{w}])",
    "error_ratio": "rate(slotune_service_errors_total{{{sel}}}[{w}]) / rate(slotune_service_requests_total{{{sel}}}[{w}])",
}


class PrometheusError(RuntimeError):
    """Prometheus could not be reached, was too slow, refused a query or answered something
    that is not a range query's answer; the message names both. The only error a query raises
    for what Prometheus (or whatever answers at its URL) sends."""


def label_value(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def deploy_labels(host: str, environment: str, window: str) -> str:
    """1 per instance of the host's daemon at each step, labelled with the environment and
    deploy id it exported within the step's window (the values' own window, not the
    5-minute lookback: a deploy's id ends where its samples do); in the one step where
    two deploys meet, one of them."""
    return (f"topk by (instance) (1, last_over_time({DEPLOY_INFO}{{host={label_value(host)},"
            f"environment={label_value(environment)}}}[{window}]))")


def history_query(metric: str, service: str, host: str, environment: str, step_s: float,
                  histogram: str = "", q: float = 0.99) -> str:
    """PromQL for one store metric of one service, one value per step, a series per deploy id.
    With `histogram` (a service's own histogram, its name without _bucket) the metric is
    its q-quantile; the service must share `instance` with the daemon (relabel it to the host)."""
    if not step_s >= 1:
        raise ValueError(f"step {step_s!r} s must be at least 1 s (at least 2 scrape intervals for the rates)")
    sel, w = f"service={label_value(service)}", f"{int(step_s)}s"
    join = f"* on (instance) group_left (environment, deploy_id) {deploy_labels(host, environment, w)}"
    if histogram:
        if not METRIC_NAME.fullmatch(histogram):
            raise ValueError(f"histogram name {histogram!r} is not a Prometheus metric name")
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile {q!r} must be within 0..1 (0.99 for P99)")
        return (f"histogram_quantile({q}, sum by (le, environment, deploy_id) "
                f"(rate({histogram}_bucket{{{sel}}}[{w}]) {join}))")
    if metric not in STORE_METRICS:
        raise ValueError(f"no PromQL for metric {metric!r}; known: {', '.join(STORE_METRICS)} "
                         "(or name a service's own histogram)")
    return f"({STORE_METRICS[metric].format(sel=sel, w=w)}) {join}"


class PrometheusHistory:
    """timeout_s bounds one query_range (by_deploy, import_into) whole: every chunk's exchange,
    connecting to the last byte, ends by one deadline; each answer is read up to MAX_ANSWER_BYTES."""

    def __init__(self, url: str, timeout_s: float = 30.0):
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s

    def query_range(self, query: str, start: float, end: float, step: float) -> list[tuple[dict, list]]:
        """Each series' (labels, [(t, value)]), in chunks Prometheus accepts; NaN points left out."""
        if not (step > 0 and end >= start):
            raise ValueError(f"query range start={start} end={end} step={step}: need step > 0 and end >= start")
        deadline = time.monotonic() + self.timeout_s
        series: dict[tuple, tuple[dict, list]] = {}
        chunk_start = start
        while chunk_start <= end:
            chunk_end = min(end, chunk_start + step * (MAX_POINTS - 1))
            for labels, points in self._query_chunk(query, chunk_start, chunk_end, step, deadline):
                series.setdefault(tuple(sorted(labels.items())), (labels, []))[1].extend(points)
            chunk_start = chunk_end + step
        return list(series.values())

    def _query_chunk(self, query, start, end, step, deadline: float) -> list[tuple[dict, list]]:
        url = f"{self.url}/api/v1/query_range?" + urlencode(
            {"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"})
        where = f"Prometheus at {self.url}, query {query}"
        body = _answer(*self._get(url, where, deadline), where)
        try:
            return [(_labels(s["metric"]), _points(s["values"])) for s in body["data"]["result"]]
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            raise PrometheusError(f"{where}: not a range query answer ({type(exc).__name__}: "
                                  f"{_printable(str(exc))}): is this URL Prometheus' query API?") from None

    def _get(self, url: str, where: str, deadline: float) -> tuple[int, str, bytes]:
        """(status, Location, body) of one GET, whole by the deadline."""
        left = deadline - time.monotonic()
        try:
            if left <= 0:
                raise TimeoutError
            return exchange(url, timeout_s=left, max_bytes=MAX_ANSWER_BYTES)
        except TimeoutError:
            raise PrometheusError(f"{where}: no complete answer within {self.timeout_s:g} s") from None
        except TooLarge:
            raise PrometheusError(f"{where}: the answer is larger than {MAX_ANSWER_BYTES} bytes: "
                                  "ask for a shorter range or a longer step") from None
        except (OSError, http.client.HTTPException, ValueError) as exc:
            raise PrometheusError(f"{where}: not reachable: {_printable(str(exc) or type(exc).__name__)} "
                                  "(check the URL and that Prometheus runs)") from None

    def by_deploy(self, query: str, start: float, end: float, step: float) -> dict[str, list[tuple[float, float]]]:
        """deploy id -> its (t, value) points in time order, for a history_query. Two series of
        one deploy (two daemons claiming the same host) are refused, naming both."""
        out: dict[str, list] = {}
        owners: dict[str, dict] = {}
        for labels, points in self.query_range(query, start, end, step):
            deploy = labels.get("deploy_id", "")
            if not deploy:
                raise PrometheusError(f"Prometheus at {self.url}, query {query}: a series without deploy_id "
                                      f"({labels}); the query must join {DEPLOY_INFO}")
            if deploy in owners:
                raise PrometheusError(
                    f"Prometheus at {self.url}, query {query}: two series for deploy {deploy!r} ({owners[deploy]} "
                    f"and {labels}): two daemons export the same host label; give each host its own hostname")
            owners[deploy] = labels
            out[deploy] = sorted(points)
        return out

    def import_into(self, store, service: str, metric: str, query: str, *, start: float, end: float,
                    step: float, environment: str) -> dict[str, list[tuple[float, float]]]:
        """Copy a history_query's series into the baseline store as `metric`, each under its
        deploy id; returns the points stored, per deploy. Steps are aligned to multiples of
        `step`, so importing the same range again replaces, it does not double."""
        deploys = self.by_deploy(query, math.floor(start / step) * step, end, step)
        for deploy, points in deploys.items():
            store.record_many((service, metric, v, t, environment, deploy) for t, v in points)
        return deploys


def _answer(status: int, location: str, answer: bytes, where: str) -> dict:
    """A successful query's JSON answer; PrometheusError naming what came instead."""
    if 300 <= status < 400:
        raise PrometheusError(f"{where}: HTTP {status}, a redirect to {_printable(location)}; slotune follows "
                              "no redirects: set prometheus_url to the address that answers")
    try:
        body = json_value(answer, f"{where}: the answer", MAX_ANSWER_BYTES)
    except Untrusted as exc:
        if status >= 400:
            raise PrometheusError(f"{where}: HTTP {status}: {_printable(answer.decode(errors='replace'))}") from None
        raise PrometheusError(f"{exc}: is this URL Prometheus?") from None
    if not isinstance(body, dict) or body.get("status") != "success":
        error = _printable(str(body.get("error") if isinstance(body, dict) else body))
        if status >= 400:
            raise PrometheusError(f"{where}: HTTP {status}: {error}")
        raise PrometheusError(f"{where}: {error}: is this URL Prometheus' (or Thanos/Mimir's) query API?")
    return body


def _labels(labels: object) -> dict[str, str]:
    """A series' labels: an object of strings."""
    if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
        raise TypeError("a series' metric is not an object of label -> string")
    return labels


def _points(values: object) -> list[tuple[float, float]]:
    """A series' [t, "value"] pairs as (t, value), NaN and infinite values left out."""
    if not isinstance(values, list):
        raise TypeError("a series' values are not a list")
    points = [(float(t), float(v)) for t, v in values]
    if not all(math.isfinite(t) for t, _ in points):
        raise ValueError("a point's time is not a finite number")
    return [(t, v) for t, v in points if math.isfinite(v)]


def _printable(text: str) -> str:
    """What Prometheus sent, fit for one log line."""
    return " ".join(text.split())[:DETAIL_CHARS]
