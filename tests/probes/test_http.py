"""HTTP request latency from the kernel, for a server whose handler sleeps a known
time: the histogram's median is within 10 % of the sleep and every request is
counted exactly once (new connections and keep-alive ones alike); a request is
counted as it arrives, before its answer."""
import http.client
import threading
import time

from slotune.model.service import ServiceSpec
from tests.probes.agreement import record
from tests.probes.conftest import collected, hist

SLEEP_S = 0.04
KEY = ("http_request", "")
ARRIVED = ("http_arrived", "")
HANDLER_S = 3.0       # the handler of the arrivals test: its requests wait this long for an answer


def test_request_latency_median_and_exact_count(kernel, spawn, tag):
    server = spawn("http_server", tag, SLEEP_S)
    port = int(server.stdout.readline())
    collector = kernel([ServiceSpec("web", cmdline=f"http_server.py {tag}")], ["http"])
    collected(collector)
    requests = 0
    for _ in range(10):                            # a new connection each
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/")
        assert conn.getresponse().read() == b"ok\n"
        conn.close()
        requests += 1
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    for _ in range(15):                            # keep-alive on one connection
        conn.request("GET", "/")
        assert conn.getresponse().read() == b"ok\n"
        requests += 1
    conn.close()
    h = hist(collected(collector)["web"].histograms, KEY)
    print(f"{h.count} requests, p50 {h.quantile(0.5) * 1e3:.1f} ms, mean {h.mean() * 1e3:.1f} ms")
    record("HTTP requests (Python http.server)", "the requests the client sent", h.count, requests, "requests", "exact")
    record("HTTP request latency P50 (Python http.server)", "the handler's fixed sleep", h.quantile(0.5) * 1e3,
           SLEEP_S * 1e3, "ms", "within 10 %")
    assert h.count == requests
    assert abs(h.quantile(0.5) - SLEEP_S) <= 0.1 * SLEEP_S


def test_a_service_that_only_talks_gets_no_requests(kernel, spawn, tag):
    """A client (no accept) is not mistaken for a server."""
    server = spawn("http_server", tag, 0.0)
    port = int(server.stdout.readline())
    client = spawn("tls_pair", "client", f"{tag}-c", port, 5, 0, "plain")
    collector = kernel([ServiceSpec("client", cmdline=f"tls_pair.py client {tag}-c")], ["http"])
    collected(collector)
    client.stdin.write("go\n")
    client.stdin.flush()
    assert client.stdout.readline().strip() == "[]"
    assert KEY not in collected(collector)["client"].histograms


def test_requests_are_counted_as_they_arrive_not_when_answered(kernel, spawn, tag):
    """A stalled server's load is seen while it stalls: requests read count in the
    interval they came in, before any answer, and once only."""
    server = spawn("http_server", tag, HANDLER_S)
    port = int(server.stdout.readline())
    collector = kernel([ServiceSpec("web", cmdline=f"http_server.py {tag}")], ["http"])
    collected(collector)
    answers = []

    def ask():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/")
        answers.append(conn.getresponse().read())
        conn.close()

    clients = [threading.Thread(target=ask) for _ in range(6)]
    for c in clients:
        c.start()
    arrived = answered = 0                         # intervals' counts while the handler sleeps
    deadline = time.monotonic() + HANDLER_S - 0.5
    while arrived < len(clients) and time.monotonic() < deadline:
        time.sleep(0.05)
        during = {s.service: s for s in collector.collect(0.0, 0.0)}["web"]
        arrived += during.counters.get(ARRIVED, 0)
        answered += hist(during.histograms, KEY).count
    for c in clients:
        c.join()
    after = collected(collector)["web"]
    print(f"while they wait: {arrived:.0f} arrived, {answered} answered; after: "
          f"{after.counters.get(ARRIVED, 0):.0f} arrived, {hist(after.histograms, KEY).count} answered")
    record("HTTP requests counted as they arrive, before their answer (Python http.server)",
           "the requests the client sent", arrived, len(clients), "requests", "exact")
    assert answers == [b"ok\n"] * 6
    assert arrived == 6 and answered == 0
    assert ARRIVED not in after.counters and hist(after.histograms, KEY).count == 6


def test_requests_for_untimed_paths_are_neither_counted_nor_timed(kernel, spawn, tag):
    """The daemon's own GET of a service's /metrics (each second), Prometheus' and health
    checks are no load of its users: a service's untimed_paths, and its metrics_url's path,
    are left out of its requests and their times (the query string aside), on new and
    keep-alive connections alike; a path that only starts like one is timed."""
    server = spawn("http_server", tag, SLEEP_S)
    port = int(server.stdout.readline())
    spec = ServiceSpec("web", cmdline=f"http_server.py {tag}", metrics_url=f"http://127.0.0.1:{port}/metrics",
                       untimed_paths=("/healthz",))
    assert spec.untimed() == ("/healthz", "/metrics")
    collector = kernel([spec], ["http"])
    collected(collector)
    paths = ["/", "/metrics", "/healthz", "/metrics?name=x", "/metricsx", "/api/healthz", "/"]
    for path in paths:                              # a new connection each
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", path)
        assert conn.getresponse().read() == b"ok\n"
        conn.close()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    for path in paths * 2:                          # keep-alive, untimed ones between timed ones
        conn.request("GET", path)
        assert conn.getresponse().read() == b"ok\n"
    conn.close()
    timed = 3 * sum(p in ("/", "/metricsx", "/api/healthz") for p in paths)
    samples = collected(collector)["web"]
    h, arrived = hist(samples.histograms, KEY), samples.counters.get(ARRIVED, 0)
    record("HTTP requests less untimed paths (Python http.server)", "the timed requests the client sent", h.count,
           timed, "requests", "exact")
    assert (h.count, arrived) == (timed, timed), (h.count, arrived, timed, 3 * len(paths))
    assert abs(h.quantile(0.5) - SLEEP_S) <= 0.1 * SLEEP_S
