"""A service's own /metrics as untrusted input: real HTTP servers on loopback
that answer with a bucket without `le`, bytes that are not UTF-8, text that does
not parse, decreasing buckets, counts of 1.5e308 or 400 digits, 12 000 labels on
a line, a broken chunked body, 10 MB, a trickle, or 50 000 series, each beside a
healthy service whose samples must still arrive with the right deltas; and only
the families slotune reads are kept."""
import ast
import logging
import re
import time

import pytest

from slotune.collectors.service_metrics import MAX_SERIES, READ_WAIT_S, ServiceMetricsCollector, parse_stub_status
from slotune.profiles import reference
from slotune.model.service import ServiceSpec
from tests.conftest import ROOT
from slotune.tuners import TUNERS

TUNER_FILES = [str(module.__file__) for module in TUNERS.values()]


def answer_with(body_of):
    """An HTTP/1.1 answer whose body is body_of(n) for the n-th request (from 1)."""
    served = []

    def answer(conn, _request, _stopped):
        served.append(None)
        body = body_of(len(served))
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n"
                     b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
    return answer


def healthy(n: int) -> bytes:
    """After n scrapes: 2n requests (one at 0.05 s, one at 0.5 s), 3n tool calls, 7 in flight."""
    return f"""# TYPE api_request_duration_seconds histogram
api_request_duration_seconds_bucket{{outcome="ok",le="0.1"}} {n}
api_request_duration_seconds_bucket{{outcome="ok",le="1.0"}} {2 * n}
api_request_duration_seconds_bucket{{outcome="ok",le="+Inf"}} {2 * n}
api_request_duration_seconds_sum{{outcome="ok"}} {0.55 * n}
api_request_duration_seconds_count{{outcome="ok"}} {2 * n}
# TYPE api_tool_calls_total counter
api_tool_calls_total{{tool="search",outcome="ok"}} {3 * n}
# TYPE api_inflight_requests gauge
api_inflight_requests 7
# TYPE api_unread_seconds histogram
api_unread_seconds_bucket{{le="+Inf"}} {n}
api_unread_seconds_sum {n}
api_unread_seconds_count {n}
# TYPE api_unread_total counter
api_unread_total {n}
""".encode()


def trickle(body_too_only: bool):
    """Two bytes a second (each faster than a per-recv timeout would notice), for 20 s."""
    def answer(conn, _request, stopped):
        body = b"api_inflight_requests 1\n" * 40
        head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body)
        if body_too_only:
            conn.sendall(head)
        for byte in body if body_too_only else head + body:
            if stopped.wait(0.5):
                return
            conn.sendall(bytes([byte]))
    return answer


def chunked_with_a_bad_size(conn, _request, _stopped):
    conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\napi_inflight_requests 1\r\n0\r\n\r\n")


# Each bucket passed a check of its own; two reads merged gave inf, and int(round(inf)) raised.
HUGE_COUNTS = b"""# TYPE api_request_duration_seconds histogram
api_request_duration_seconds_bucket{outcome="ok",le="0.1"} 1.5e308
api_request_duration_seconds_bucket{outcome="ok",le="+Inf"} 1.5e308
api_request_duration_seconds_sum{outcome="ok"} 1
"""
LABELS_12000 = ",".join(f'l{i}="v"' for i in range(12_000)).encode()    # 121 kB: 6 s of a quadratic regex

BAD = {
    "bucket-without-le": (answer_with(lambda n: b"# TYPE x_queue_wait_seconds histogram\n"
                                                b"x_queue_wait_seconds_bucket 3\nx_queue_wait_seconds_sum 1\n"),
                          "histogram bucket without le"),
    "non-utf8-bytes": (answer_with(lambda n: b"# TYPE x_inflight_requests gauge\nx_inflight_requests{a=\"\xff\xfe\"} 1\n"),
                       "not UTF-8"),
    "unparsable-text": (answer_with(lambda n: b"this is { not the prometheus format\n"), "does not parse"),
    "decreasing-buckets": (answer_with(lambda n: b"# TYPE x_queue_wait_seconds histogram\n"
                                                 b"x_queue_wait_seconds_bucket{le=\"0.1\"} 5\n"
                                                 b"x_queue_wait_seconds_bucket{le=\"+Inf\"} 2\n"),
                           "does not parse"),
    "counts-of-1.5e308": (answer_with(lambda n: HUGE_COUNTS), "does not parse"),
    "bucket-of-400-digits": (answer_with(lambda n: HUGE_COUNTS.replace(b"1.5e308", b"9" * 400)), "does not parse"),
    "bucket-le-nan": (answer_with(lambda n: b"# TYPE x_queue_wait_seconds histogram\n"
                                            b"x_queue_wait_seconds_bucket{le=\"NaN\"} 1\n"),
                      "le not a number"),
    "12000-labels-one-named-twice": (answer_with(lambda n: b"# TYPE x_inflight_requests gauge\nx_inflight_requests{"
                                                           + LABELS_12000 + b',l11999="v"} 1\n'), "does not parse"),
    "a-type-line-the-parser-trips-on": (answer_with(lambda n: b"# TYPE \x1c gauge\n"), "does not parse"),
    "chunked-size-not-hex": (chunked_with_a_bad_size, "cannot be read"),
    "10-mb-body": (answer_with(lambda n: b"# TYPE x_unread gauge\n" + b"x_unread 1\n" * 1_000_000), "too large"),
    "body-trickled-2-bytes-per-second": (trickle(True), "took longer than"),
    "head-trickled-2-bytes-per-second": (trickle(False), "took longer than"),
}


def collector_for(*servers, wait_s: float = 30.0) -> ServiceMetricsCollector:
    """A collector of these (name, server)s whose collect() waits up to wait_s for the reads
    (the daemon's ticks wait READ_WAIT_S): a test whose subject is not that wait sees every read."""
    c = ServiceMetricsCollector()
    c.read_wait_s = wait_s
    c.start([ServiceSpec(name, metrics_url=f"http://127.0.0.1:{server.port}/metrics",
                         latency_metric="api_request_duration_seconds") for name, server in servers])
    return c


@pytest.mark.parametrize("kind", list(BAD))
def test_one_bad_service_beside_a_healthy_one(serve, caplog, kind):
    answer, words = BAD[kind]
    good, bad = serve(answer_with(healthy)), serve(answer)
    collector = collector_for(("good", good), ("bad", bad), wait_s=READ_WAIT_S)
    try:
        with caplog.at_level(logging.WARNING, logger="slotune.collectors.service_metrics"):
            took, samples = [], []

            def said():
                return [r.getMessage() for r in caplog.records if "service bad" in r.getMessage()]
            deadline = time.monotonic() + collector.timeout_s + 10.0
            while (not said() or len(samples) < 3) and time.monotonic() < deadline:
                t0 = time.monotonic()
                samples.append(collector.collect(0.0, 1.0))
                took.append(time.monotonic() - t0)
            samples.append(collector.collect(0.0, 1.0))      # once more: said once, not every interval
        # Every tick has the good service's sample (its first read sets the starting point) and
        # none waits for the bad one's read longer than READ_WAIT_S: it goes on beside the ticks.
        assert all([s.service for s in tick] in ([], ["good"]) for tick in samples), samples
        assert sum(map(len, samples)) >= 2, samples
        for good_sample in (tick[0] for tick in samples if tick):
            latency = good_sample.histograms[("api_request_duration_seconds", "outcome=ok")]
            assert latency.count == 2 and latency.total_s == pytest.approx(0.55)
            assert good_sample.counters == {("api_tool_calls_total", "outcome=ok,tool=search"): 3.0}
            assert good_sample.gauges == {("api_inflight_requests", ""): 7.0}
        assert max(took) < READ_WAIT_S + 0.5, took
        said = said()
        assert len(said) == 1, said
        assert f"http://127.0.0.1:{bad.port}/metrics" in said[0] and words in said[0]
        assert not [r for r in caplog.records if "service good" in r.getMessage()]
    finally:
        collector.close()


def test_a_service_that_keeps_timing_out_is_read_again_only_after_its_back_off(serve):
    good, slow = serve(answer_with(healthy)), serve(trickle(False))
    collector = collector_for(("good", good), ("slow", slow))
    now = [0.0]
    collector.clock = lambda: now[0]
    try:
        for _ in range(16):      # 16 ticks of 1 s: read at 0, 1 (+1 s), 3 (+2 s), 7 (+4 s), 15 (+8 s)
            samples = collector.collect(now[0], now[0] + 1.0)
            now[0] += 1.0
            deadline = time.monotonic() + collector.timeout_s + 10.0
            while not all(f.done() for *_, f in collector.reading.values()) and time.monotonic() < deadline:
                time.sleep(0.01)     # a late read goes on beside the ticks: a tick of 1 s outlasts it
        assert len(slow.requests) == 5 and len(good.requests) == 16
        assert [s.service for s in samples] == ["good"]
    finally:
        collector.close()


def test_a_number_past_a_floats_range_is_left_out_as_inf_is(serve):
    """A counter and a gauge of 400 digits (int() reads them, float() cannot): OverflowError
    came out of the collector; now they are left out, as is one past MAX_VALUE (whose deltas
    could overflow), and the rest of the body is read."""
    def past_floats(n):
        return (b"# TYPE api_tool_calls_total counter\napi_tool_calls_total{tool=\"a\"} " + b"9" * 400 +
                b"\n# TYPE api_inflight_requests gauge\napi_inflight_requests{at=\"x\"} " + b"9" * 400 +
                b"\napi_inflight_requests{at=\"y\"} -1e200\napi_inflight_requests 7\n")
    wide, good = serve(answer_with(past_floats)), serve(answer_with(healthy))
    collector = collector_for(("wide", wide), ("good", good))
    try:
        for _ in range(2):
            samples = {s.service: s for s in collector.collect(0.0, 1.0)}
    finally:
        collector.close()
    assert samples["wide"].counters == {} and samples["wide"].gauges == {("api_inflight_requests", ""): 7.0}
    assert samples["good"].counters[("api_tool_calls_total", "outcome=ok,tool=search")] == 3.0


def test_stub_status_numbers_past_any_real_total_are_left_out():
    """400 digits read as inf, 101 as 1e101: each left out, as parse() leaves such a counter out."""
    page = ("Active connections: " + "9" * 400 + "\nserver accepts handled requests\n 1 2 3\n"
            "Reading: 0 Writing: 1 Waiting: " + "9" * 101 + "\n")
    _, counters, gauges = parse_stub_status(page)
    assert counters == {("nginx_connections_accepted_total", ""): 1.0, ("nginx_connections_handled_total", ""): 2.0,
                        ("nginx_http_requests_total", ""): 3.0}
    assert gauges == {("nginx_connections_reading", ""): 0.0, ("nginx_connections_writing", ""): 1.0}


def test_a_service_exporting_50000_series_keeps_at_most_the_cap(serve, caplog):
    def many(n):
        lines = [f'api_inflight_requests{{id="{i}"}} {n}' for i in range(50_000)]
        return ("# TYPE api_inflight_requests gauge\n" + "\n".join(lines) + "\n").encode()
    wide, good = serve(answer_with(many)), serve(answer_with(healthy))
    collector = collector_for(("wide", wide), ("good", good))
    try:
        with caplog.at_level(logging.WARNING, logger="slotune.collectors.service_metrics"):
            for _ in range(3):
                samples = {s.service: s for s in collector.collect(0.0, 1.0)}
        kept = samples["wide"]
        assert 0 < len(kept.histograms) + len(kept.counters) + len(kept.gauges) <= MAX_SERIES
        assert len(collector.previous["wide"][0]) + len(collector.previous["wide"][1]) <= MAX_SERIES
        said = [r.getMessage() for r in caplog.records if "service wide" in r.getMessage()]
        assert len(said) == 1 and str(MAX_SERIES) in said[0], said
        assert samples["good"].counters[("api_tool_calls_total", "outcome=ok,tool=search")] == 3.0
    finally:
        collector.close()


def test_families_slotune_does_not_read_are_dropped(serve):
    good = serve(answer_with(healthy))
    collector = collector_for(("good", good))
    try:
        collector.collect(0.0, 1.0)
        sample = collector.collect(0.0, 1.0)[0]
    finally:
        collector.close()
    families = {fam for fam, _ in [*sample.histograms, *sample.counters, *sample.gauges]}
    assert families == {"api_request_duration_seconds", "api_tool_calls_total", "api_inflight_requests"}


def test_every_suffix_the_readers_look_for_is_kept():
    """The suffixes the readers of windows look families up by (literals such as
    "_queue_wait_seconds" passed to endswith() or to a helper) are all signals of the
    reference profile (daemon/profiles/reference.py), so none is dropped at the scrape."""
    looked_up = set()
    for path in ("daemon/control/observations.py", "daemon/attribution/causes.py", *TUNER_FILES):
        calls = [node for node in ast.walk(ast.parse((ROOT / path).read_text())) if isinstance(node, ast.Call)]
        looked_up |= {arg.value for call in calls for arg in call.args if isinstance(arg, ast.Constant)
                      and isinstance(arg.value, str) and re.fullmatch(r"_[a-z0-9_]+", arg.value)}
    read = {"_" + signal for signal in reference.PROFILE.signals}
    assert looked_up and looked_up <= read, looked_up - read


def test_a_late_service_holds_a_tick_once_then_its_reads_go_on_beside_the_ticks(serve):
    # The chaos bench's trickling services held a tick 0.8 s each time their back-off let them
    # be read again, and a healthy service's tuner missed its interval. Now a tick waits only for
    # services whose last read was on time; a late one's read is taken when it ends.
    good, slow = serve(answer_with(healthy)), serve(trickle(True))
    collector = collector_for(("good", good), ("slow", slow), wait_s=READ_WAIT_S)
    now = [0.0]
    collector.clock = lambda: now[0]
    took, served = [], []
    try:
        deadline = time.monotonic() + 30.0
        while len(slow.requests) < 4 and time.monotonic() < deadline:
            t0 = time.monotonic()
            served.append([s.service for s in collector.collect(now[0], now[0] + 1.0)])
            took.append(time.monotonic() - t0)
            now[0] += 1.0       # its back-off runs on this clock: read again soon, as often as may be
    finally:
        collector.close()
    assert len(slow.requests) >= 4, took
    assert took[0] >= collector.timeout_s                 # the first read of each is waited for
    assert max(took[1:]) < 0.5, took                      # never again for the slow one
    assert all(s in ([], ["good"]) for s in served) and served.count(["good"]) >= len(served) - 2, served
