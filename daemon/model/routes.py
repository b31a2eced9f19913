"""The route class of the kernel's HTTP signals, as OpenTelemetry's `http.route`: where a
service lists `routes` (path prefixes), each of its HTTP series is labelled with the one
its requests started with, or `other`, and the service is judged on its routes alone."""
from __future__ import annotations

from slotune.model import labels, signals
from slotune.model.histogram import add_into

ROUTE = "route"
OTHER = "other"          # the class of the requests none of the service's routes starts
# The signals that carry it (the http family's), where the service has routes.
ROUTED = frozenset((signals.HTTP_REQUEST, signals.HTTP_FIRST_BYTE, signals.HTTP_WRITE_GAP, signals.HTTP_STATUS,
                    signals.HTTP_REFUSED, signals.HTTP_ARRIVED))


def label(route: str, own: dict[str, str]) -> str:
    """A routed series' label: its route class beside its own label ({"status": "5xx"})."""
    return labels.key({ROUTE: route, **own})


def judged(routes: tuple[str, ...], histograms: dict, counters: dict) -> tuple[dict, dict]:
    """A service's series as it is judged: those of its routes added into the series
    without a route label (("http_request", "route=/v1/completions") into ("http_request",
    ""), ("http_status", "route=...,status=5xx") into ("http_status", "5xx")), the `other`
    class left out. Without routes, as they are."""
    if not routes:
        return histograms, counters
    kept: dict = {}
    for key, h in _judged(routes, histograms):
        add_into(kept, key, h)
    count: dict = {}
    for key, v in _judged(routes, counters):
        count[key] = count.get(key, 0.0) + v
    return kept, count


def _judged(routes: tuple[str, ...], series: dict):
    """(key without its route, value) of each series of a judged route or with none."""
    for (name, label), value in series.items():
        own = labels.parse(label) if name in ROUTED and "=" in label else {}
        route = own.pop(ROUTE, None)
        if route is None:
            yield (name, label), value
        elif route in routes:
            yield (name, next(iter(own.values()), "")), value
