"""HAProxy (2.4+): its built-in Prometheus exporter, served where haproxy.cfg says
(`http-request use-service prometheus-exporter if { path /metrics }`), families
`haproxy_<frontend|backend|server>_*` labelled proxy (and server). It keeps no
latency histogram, only averages over the last 1024 requests, so the tail comes from
eBPF. Names: the exporter's README (https://github.com/haproxy/haproxy/blob/master/addons/promex/README)
and HAProxy 2.6 as installed here. Limits are set live through the runtime API
(`set maxconn server`, `set rate-limit sessions global`; management guide section 9.3,
https://docs.haproxy.org/2.6/management.html): it is where a proxied engine with no
live knob of its own is throttled (admission_by)."""
import re

from slotune.profiles import Counter, Gauge, Profile, Setting

NAME = r"[A-Za-z0-9_.:-]+"   # the characters HAProxy allows in proxy and server names
TARGETS = {   # the form of a target -> how its value is read back
    re.compile(rf"maxconn server (?P<proxy>{NAME})/(?P<server>{NAME})"): "stat",
    re.compile(rf"maxconn frontend (?P<proxy>{NAME})"): "stat",
    re.compile(r"maxconn global"): "Maxconn",
    re.compile(r"rate-limit sessions global"): "SessRateLimit",
    re.compile(r"rate-limit connections global"): "ConnRateLimit",
}
FORMS = "maxconn server BACKEND/SERVER, maxconn frontend FRONTEND, maxconn global, " \
        "rate-limit sessions global or rate-limit connections global"


def target_error(target: str) -> str | None:
    if form(target) is None:
        return f"{target!r} is not a HAProxy limit slotune sets; one of {FORMS}"
    return None


def form(target: str):
    """(the match, how its value is read back) of the form target has, or None."""
    return next(((m, how) for rx, how in TARGETS.items() if (m := rx.fullmatch(target))), None)


PROFILE = Profile(
    name="haproxy",
    doc="https://github.com/haproxy/haproxy/blob/master/addons/promex/README",
    signals={
        "inflight_requests": Gauge(("haproxy_backend_current_sessions",)),
        "num_requests_waiting": Gauge(("haproxy_backend_current_queue",)),
        "queue_wait_mean_seconds": Gauge(("haproxy_backend_queue_time_average_seconds",)),
        "request_duration_mean_seconds": Gauge(("haproxy_backend_total_time_average_seconds",)),
        "requests_total": Counter("haproxy_backend_http_requests_total"),
        "errors_total": Counter("haproxy_backend_http_responses_total", (("code", "5xx"),)),
    },
    settings=(
        Setting("concurrency_limit", "haproxy", "maxconn server BACKEND/SERVER"),
        Setting("rate_limit_rps", "haproxy", "rate-limit sessions global"),
    ),
    processes=("haproxy",),
    control=('address = "/run/haproxy/admin.sock"   # haproxy.cfg\'s `stats socket ... level admin`',),
    marks=(r"haproxy_process_.*",),
)
