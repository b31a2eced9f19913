"""Prometheus as a history source for baselines: quantile series of a service's
latency histogram over /api/v1/query_range, and their import into the baseline
store, so a fleet can keep Prometheus as its store of record."""
from __future__ import annotations

import json
import math
import re
from urllib.error import HTTPError, URLError
from urllib.parse import urlencode
from urllib.request import urlopen

MAX_POINTS = 10_000  # Prometheus refuses more than 11 000 points per series in one query
METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


class PrometheusError(RuntimeError):
    """Prometheus could not be reached or refused a query; the message names both."""


def label_value(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def quantile_query(histogram: str, service: str, q: float, window_s: float) -> str:
    """PromQL for the q-quantile of `histogram` (its name without _bucket) for one service."""
    if not METRIC_NAME.fullmatch(histogram):
        raise ValueError(f"histogram name {histogram!r} is not a Prometheus metric name")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q!r} must be within 0..1 (0.99 for P99)")
    if not window_s >= 1:
        raise ValueError(f"rate window {window_s!r} s must be at least 1 s (4 scrape intervals is usual)")
    return (f"histogram_quantile({q}, sum by (le) (rate({histogram}_bucket{{service={label_value(service)}}}"
            f"[{int(window_s)}s])))")


class PrometheusHistory:
    def __init__(self, url: str, timeout_s: float = 30.0):
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s

    def query_range(self, query: str, start: float, end: float, step: float) -> list[tuple[float, float]]:
        """One series' (t, value) points, in chunks Prometheus accepts; NaN points left out.
        A query that yields several series is refused: history wants one."""
        if not (step > 0 and end >= start):
            raise ValueError(f"query range start={start} end={end} step={step}: need step > 0 and end >= start")
        points: list[tuple[float, float]] = []
        chunk_start = start
        while chunk_start <= end:
            chunk_end = min(end, chunk_start + step * (MAX_POINTS - 1))
            points += self._query_chunk(query, chunk_start, chunk_end, step)
            chunk_start = chunk_end + step
        return points

    def _query_chunk(self, query, start, end, step) -> list[tuple[float, float]]:
        url = f"{self.url}/api/v1/query_range?" + urlencode(
            {"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"})
        where = f"Prometheus at {self.url}, query {query}"
        try:
            with urlopen(url, timeout=self.timeout_s) as resp:
                body = json.load(resp)
        except HTTPError as exc:
            try:
                reason = json.load(exc).get("error", exc.reason)
            except ValueError:
                reason = exc.reason
            raise PrometheusError(f"{where}: HTTP {exc.code}: {reason}") from None
        except (URLError, OSError) as exc:
            raise PrometheusError(f"{where}: not reachable: {getattr(exc, 'reason', exc)} "
                                  "(check the URL and that Prometheus runs)") from None
        except ValueError as exc:
            raise PrometheusError(f"{where}: answer is not JSON ({exc}): is this URL Prometheus?") from None
        if body.get("status") != "success":
            raise PrometheusError(f"{where}: {body.get('errorType', 'error')}: {body.get('error')}")
        series = body["data"]["result"]
        if len(series) > 1:
            labels = [s["metric"] for s in series[:3]]
            raise PrometheusError(f"{where}: {len(series)} series (e.g. {labels}); aggregate to one")
        values = series[0]["values"] if series else []
        return [(float(t), float(v)) for t, v in values if math.isfinite(float(v))]

    def quantile_series(self, histogram: str, service: str, q: float, start: float, end: float,
                        step: float, window_s: float = 60.0) -> list[tuple[float, float]]:
        """(t, seconds) of the q-quantile of the service's `histogram`, rate over window_s;
        steps without observations in the window are left out."""
        return self.query_range(quantile_query(histogram, service, q, window_s), start, end, step)

    def import_into(self, store, service: str, metric: str, *, histogram: str, q: float, start: float,
                    end: float, step: float, environment: str, deploy_id: str, window_s: float = 60.0) -> int:
        """Copy a quantile series into the baseline store as `metric`; returns the points stored.
        Importing the same range again replaces, it does not double."""
        series = self.quantile_series(histogram, service, q, start, end, step, window_s)
        return store.record_many((service, metric, value, t, environment, deploy_id) for t, value in series)
