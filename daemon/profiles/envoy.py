"""Envoy: the admin interface's `/stats/prometheus`, families `envoy_cluster_*`
labelled envoy_cluster_name, request time in milliseconds. Names from "Cluster
statistics" (https://www.envoyproxy.io/docs/envoy/latest/configuration/upstream/cluster_manager/cluster_stats):
upstream_rq_time (histogram, ms), upstream_rq_active, upstream_rq_pending_active,
upstream_rq_total, upstream_rq_xx by envoy_response_code_class. A cluster's
circuit-breaker thresholds are runtime keys (circuit_breakers.<cluster>.<priority>.max_requests,
"Circuit breaking" in the cluster manager docs) set live by `POST /runtime_modify`."""
import re

from slotune.profiles import Counter, Gauge, Histogram, Profile, Setting

KEY = re.compile(r"[A-Za-z0-9_.-]+")   # what a [control.targets] entry names: a runtime key


def target_error(target: str) -> str | None:
    return None if KEY.fullmatch(target) else f"{target!r} is not an Envoy runtime key (letters, digits, _ . -)"


PROFILE = Profile(
    name="envoy",
    doc="https://www.envoyproxy.io/docs/envoy/latest/configuration/upstream/cluster_manager/cluster_stats",
    signals={
        "request_duration_seconds": Histogram(("envoy_cluster_upstream_rq_time",), unit_s=1e-3),
        "inflight_requests": Gauge(("envoy_cluster_upstream_rq_active",)),
        "num_requests_waiting": Gauge(("envoy_cluster_upstream_rq_pending_active",)),
        "requests_total": Counter("envoy_cluster_upstream_rq_total"),
        "errors_total": Counter("envoy_cluster_upstream_rq_xx", (("envoy_response_code_class", "5"),)),
    },
    settings=(
        Setting("concurrency_limit", "envoy", "circuit_breakers.CLUSTER.default.max_requests"),
        Setting("pending_limit", "envoy", "circuit_breakers.CLUSTER.default.max_pending_requests"),
    ),
    metrics_path="/stats/prometheus",
    processes=("envoy",),
    control=('url = "http://127.0.0.1:9901"   # its admin interface',),
    marks=(r"envoy_server_.*",),
)
