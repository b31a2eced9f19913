"""nginx: its stub_status page (ngx_http_stub_status_module,
https://nginx.org/en/docs/http/ngx_http_stub_status_module.html) is all it says of
itself: active, reading, writing and waiting connections, and accepted, handled and
request totals, read here under the names nginx-prometheus-exporter gives them
(nginx_connections_*, nginx_http_requests_total). Latency and the rest come from eBPF.
Requests in flight are the connections reading a request or writing an answer.
The concurrency limit lives in an include file slotune writes (`limit_conn`), checked
with `nginx -t` and loaded with `nginx -s reload`."""
from daemon.profiles import Counter, Gauge, Profile, Setting

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
