"""HTTP signals by route class: nginx answers two routes of an OpenAI-style server
with very different latencies (a slow chat completion, a fast completion, one of
whose paths fails and one refuses) beside /health and /v1/models. The service lists
the two routes: each of its HTTP series comes labelled with the route its requests
started with, or `other`, and the counts per route and status are exactly the
client's own; each route's latency is its own handler's; the service's window (its
latency, TTFT, arrivals, errors and refusals) holds its routes' requests alone."""
import http.client
import time
from collections import Counter

import numpy as np

from slotune.model import labels, routes
from slotune.model.service import ServiceSpec
from slotune.model.window import EBPF_ARRIVED, build
from tests.probes.agreement import record
from tests.probes.conftest import collected, hist
from tests.probes.test_http_streaming import echo_nginx, private_host  # noqa: F401

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
CHAT_S, COMPLETIONS_S = 0.3, 0.05           # each route's handler: echo_sleep
# Each connection's requests, in turn: (method, path); "/v1/chat" is the start of a route,
# not a route ("other"). No request has a body: one that nginx's `return` reads after its
# answer would count as another request (docs/probes.md, "HTTP routes").
REQUESTS = [("POST", CHAT), ("GET", "/health"), ("POST", COMPLETIONS), ("GET", "/v1/models"),
            ("POST", COMPLETIONS + "/fail"), ("GET", "/health"), ("POST", CHAT), ("POST", COMPLETIONS + "?n=2"),
            ("POST", COMPLETIONS + "/busy"), ("GET", "/v1/chat"), ("DELETE", COMPLETIONS)]
CONNECTIONS = 3


def route_of(path: str) -> str:
    """The client's own classing: the first route that starts the path."""
    return next((r for r in (CHAT, COMPLETIONS) if path.startswith(r)), routes.OTHER)


def test_counts_and_latency_by_route_and_the_window_judges_the_routes_alone(kernel, started, tmp_path,
                                                                           private_host):  # noqa: F811
    _, addr = private_host
    port = 8080
    echo_nginx(started, tmp_path, private_host, port, f"""
        location {CHAT} {{ echo_sleep {CHAT_S}; echo ok; }}
        location {COMPLETIONS} {{ echo_sleep {COMPLETIONS_S}; echo ok; }}
        location = {COMPLETIONS}/fail {{ return 500; }}
        location = {COMPLETIONS}/busy {{ return 503; }}
        location = /health {{ return 200 "ok\\n"; }}
        location / {{ return 200 "[]\\n"; }}""")
    spec = ServiceSpec("llm", cmdline=f"nginx -p {tmp_path} ", routes=(CHAT, COMPLETIONS))
    collector = kernel([spec], ["http"])
    collected(collector)
    answers = []                                   # (route, status, seconds) as the client saw each
    for _ in range(CONNECTIONS):
        conn = http.client.HTTPConnection(addr, port, timeout=10)
        for method, path in REQUESTS:
            start = time.perf_counter()
            conn.request(method, path)
            response = conn.getresponse()
            response.read()
            answers.append((route_of(path), response.status, time.perf_counter() - start))
        conn.close()
    sample = collected(collector)["llm"]

    sent = Counter(route for route, _, _ in answers)
    for route, n in sent.items():
        label = routes.label(route, {})
        timed = hist(sample.histograms, ("http_request", label)).count
        record(f"HTTP requests of route {route} (nginx)", "the requests the client sent", timed, n, "requests", "exact")
        assert (timed, sample.counters.get(("http_arrived", label))) == (n, n), route
    statuses = {key: n for key, n in sample.counters.items() if key[0] == "http_status"}
    assert statuses == {("http_status", routes.label(route, {"status": status})): n
                        for (route, status), n in Counter((r, f"{s // 100}xx") for r, s, _ in answers).items()}
    classes = {labels.value(label, routes.ROUTE) for _, label in (*sample.histograms, *sample.counters)}
    assert classes == {CHAT, COMPLETIONS, routes.OTHER}
    for route, sleep_s in ((CHAT, CHAT_S), (COMPLETIONS, COMPLETIONS_S)):
        p50 = hist(sample.histograms, ("http_request", routes.label(route, {}))).quantile(0.5)
        record(f"HTTP request latency P50 of route {route} (nginx)", "its handler's echo_sleep", p50 * 1e3,
               sleep_s * 1e3, "ms", "within 10 %")
        assert abs(p50 - sleep_s) <= 0.1 * sleep_s, route

    # The window: the routes' requests alone, refusals (503) apart, as the client saw them.
    window = build(spec, 0.0, 1.0, [sample])
    judged = [(status, seconds) for route, status, seconds in answers if route != routes.OTHER]
    served = [seconds for status, seconds in judged if status != 503]
    want = {"timed": len(served), "first bytes": len(served), "arrived": len(judged),
            "errors": sum(status == 500 for status, _ in judged), "refused": len(judged) - len(served)}
    got = {"timed": window.requests, "first bytes": window.ttft.count, "arrived": window.counters[EBPF_ARRIVED],
           "errors": window.errors, "refused": window.rejected}
    print(f"sent {dict(sent)}; window {got}, P50 {window.p(0.5) * 1e3:.1f} ms, P99 {window.p(0.99) * 1e3:.1f} ms; "
          f"client P50 {np.median(served) * 1e3:.1f} ms, P99 {np.percentile(served, 99) * 1e3:.1f} ms")
    assert window.latency_source == "ebpf" and got == want
    for q in (0.5, 0.99):      # with /health and /v1/models in it, its P50 would be theirs (< 1 ms)
        client = float(np.percentile(served, 100 * q))
        record(f"HTTP latency P{q * 100:.0f} of a service's routes (nginx)", "the client's own clock",
               window.p(q) * 1e3, client * 1e3, "ms", "within 10 %")
        assert abs(window.p(q) - client) <= 0.1 * client, q
