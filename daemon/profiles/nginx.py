"""nginx: its stub_status page (ngx_http_stub_status_module,
https://nginx.org/en/docs/http/ngx_http_stub_status_module.html) is all it says of
itself: active, reading, writing and waiting connections, and accepted, handled and
request totals, read here under the names nginx-prometheus-exporter gives them
(nginx_connections_*, nginx_http_requests_total). Latency and the rest come from eBPF.
Requests in flight are the connections reading a request or writing an answer.
The concurrency limit lives in an include file slotune writes (`limit_conn`), checked
with `nginx -t` and loaded with `nginx -s reload`."""
import re

from slotune.profiles import Counter, Gauge, Profile, Setting

TEMPLATE = re.compile(r"[a-z_]+ [^;{}#\n\"'\\]*\{\}[^;{}#\n\"'\\]*")   # one directive, one {} for the value


def target_error(target: str) -> str | None:
    if not TEMPLATE.fullmatch(target) or target.count("{}") != 1:
        return (f"{target!r} is not one nginx directive with {{}} where the value goes and no ; # quotes "
                "or other braces, e.g. \"limit_conn perserver {}\" or \"limit_req zone=api burst={}\"")
    return None


PROFILE = Profile(
    name="nginx",
    doc="https://nginx.org/en/docs/http/ngx_http_stub_status_module.html",
    signals={
        "inflight_requests": Gauge(("nginx_connections_reading", "nginx_connections_writing")),
        "requests_total": Counter("nginx_http_requests_total"),
    },
    settings=(Setting("concurrency_limit", "nginx", "limit_conn ZONE {}"),),
    exposition="stub_status",
    metrics_path="/stub_status",
    processes=("nginx",),
    control=('path = "/etc/nginx/slotune-limits.conf"   # the include file slotune owns',
             'conf = "/etc/nginx/nginx.conf"             # the main file that includes it'),
)
