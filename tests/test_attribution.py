"""Attribution arithmetic pinned on small windows built by hand: the shares,
the path through downstream services, the clean verdict, jitter, eBPF-only."""
import dataclasses
import json
import math

import numpy as np
import pytest

from slotune.attribution import explain as attribution
from slotune.attribution import spans
from slotune.attribution.explain import explain
from slotune.model.sample import Sample
from slotune.model.histogram import BucketHistogram, Histogram
from slotune.model.service import ServiceSpec
from slotune.model.window import Window, build

BOUNDS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, math.inf)
CALM = (0, 100, 0, 0, 0, 0, 0)             # 100 requests in (10, 20] ms
SLOW_TAIL = (0, 90, 0, 0, 10, 0, 0)        # 10 of them in (100, 200] ms


def latency(counts) -> BucketHistogram:
    return BucketHistogram(BOUNDS, np.array(counts, dtype=float), 0.0)


def latency_at(ms: float, n: int = 100) -> BucketHistogram:
    """n observations of about `ms` milliseconds (all in the bucket whose top is ms)."""
    bounds = (ms / 1e3 * 0.999, ms / 1e3, math.inf)
    return BucketHistogram(bounds, np.array([0.0, float(n), 0.0]), n * ms / 1e3)


def per_event(total_s: float, events: int = 100) -> Histogram:
    """A kernel histogram of `events` equal durations adding up to total_s."""
    return Histogram.from_values([total_s / events * 1e9] * events)


def window(t, counts=CALM, service="svc", runqueue_s=0.001, blocking_s=0.001, extra=None) -> Window:
    w = Window(service, t, t + 1.0, 0.5, latency=latency(counts), latency_source="service")
    w.histograms[("runqueue_wait", "")] = per_event(runqueue_s)
    w.histograms[("offcpu", "sleep")] = per_event(blocking_s)
    w.histograms.update(extra or {})
    return w


def history(n_calm=20, faulty=(), **kw):
    """n_calm calm windows then the given (counts, fields) windows, one per second."""
    ws = [window(t, **kw) for t in range(n_calm)]
    ws += [window(n_calm + i, counts, **fields) for i, (counts, fields) in enumerate(faulty)]
    return ws


def test_growth_is_split_in_proportion_to_how_much_each_cause_rose():
    # Recent: P99 = 0.1 + 0.1 * 0.9 = 0.19 s. Baseline: P50 0.015 s, P99 0.0199 s.
    # runqueue rises 0.2 s/request, blocking 0.6 s/request: more than the growth, so split 1:3.
    # The rises (0.8 s per request) cover the growth: corroborated, so all of it is split.
    ws = history(faulty=[(SLOW_TAIL, {"runqueue_s": 20.001, "blocking_s": 60.001})])
    e = explain("svc", {"svc": ws}, recent_s=1.0)
    growth = 0.19 - 0.0199
    assert e.excess_s == pytest.approx(0.19 - 0.015)
    assert e.growth_s == pytest.approx(growth) and e.moved == "P99"
    assert e.noise_s == pytest.approx((0.05 * 0.0199 + attribution.NOISE_FLOOR_S) / 2)
    assert e.shares["runqueue_wait"] == pytest.approx(0.25)
    assert e.shares["blocking_syscalls"] == pytest.approx(0.75)
    assert e.top_cause == "blocking_syscalls"
    assert e.evidence["blocking_syscalls"].recent == pytest.approx(0.60001)
    assert e.evidence["blocking_syscalls"].baseline == pytest.approx(0.00001)


def test_small_rises_are_scaled_up_at_most_tail_gain_times_and_the_rest_stays_unexplained():
    # runqueue rises 0.01 s per request, the P99 grows 0.17 s (not corroborated: the band
    # is held back): credited at most 10 x 0.01 = 0.1 s.
    ws = history(faulty=[(SLOW_TAIL, {"runqueue_s": 1.001})])
    e = explain("svc", {"svc": ws}, recent_s=1.0)
    assert e.evidence["runqueue_wait"].credited_s == pytest.approx(attribution.TAIL_GAIN * 0.01)
    assert e.shares["runqueue_wait"] == pytest.approx(attribution.TAIL_GAIN * 0.01 / (0.19 - 0.0199))
    assert sum(e.shares.values()) < 0.6
    assert e.top_cause == "runqueue_wait"


def test_a_clean_service_has_no_dominant_cause_however_large_its_usual_tail():
    rng = np.random.default_rng(7)
    ws = []
    for t in range(40):
        tail = int(rng.integers(8, 12))
        w = window(t, (0, 100 - tail, 0, 0, tail, 0, 0), runqueue_s=float(rng.uniform(0.5, 0.7)),
                   blocking_s=float(rng.uniform(0.1, 0.2)))
        ws.append(w)
    e = explain("svc", {"svc": ws})
    assert e.usual_tail_s > 0.1
    assert max(e.shares.values()) <= attribution.DOMINANT_SHARE
    assert e.top_cause == "" and e.path == []
    assert e.verdict.endswith("no dominant cause")


def test_a_slow_downstream_service_is_followed_to_its_own_cause():
    gateway = history(faulty=[(SLOW_TAIL, {}), (SLOW_TAIL, {})], service="gateway")
    inference = history(faulty=[(SLOW_TAIL, {"runqueue_s": 60.0}), (SLOW_TAIL, {"runqueue_s": 60.0})],
                        service="inference")
    e = explain("gateway", {"gateway": gateway, "inference": inference}, {"gateway": ["inference"]})
    assert e.top_cause == "downstream:inference"
    assert [(svc, cause) for svc, cause, _ in e.path] == [("gateway", "downstream:inference"),
                                                          ("inference", "runqueue_wait")]
    assert e.root_cause[:2] == ("inference", "runqueue_wait")
    assert e.root_cause[2] == pytest.approx(e.path[0][2] * e.path[1][2])
    assert e.root_cause[2] > 0.7
    assert "inference → " in e.verdict and "runqueue_wait" in e.verdict


def test_a_call_cycle_in_the_config_does_not_recurse_forever():
    a = history(faulty=[(SLOW_TAIL, {})], service="a")
    b = history(faulty=[(SLOW_TAIL, {})], service="b")
    e = explain("a", {"a": a, "b": b}, {"a": ["b"], "b": ["a"]}, recent_s=1.0)
    assert e.top_cause == "downstream:b"
    assert "downstream:a" not in e.downstream["b"].shares


def test_an_ebpf_only_service_is_explained_from_kernel_request_timing():
    def sample(t, slow_ms, runqueue_s):
        fast = [15e6] * 95
        s = Sample("svc", "kernel", t, t + 1)
        s.histograms[("http_request", "")] = Histogram.from_values(fast + [slow_ms * 1e6] * 5)
        s.histograms[("runqueue_wait", "")] = per_event(runqueue_s)
        return s
    ws = [build(ServiceSpec("svc", slo_p99_s=0.5), t, t + 1, [sample(t, 16, 0.002)]) for t in range(20)]
    ws += [build(ServiceSpec("svc", slo_p99_s=0.5), t, t + 1, [sample(t, 150, 5.0)]) for t in (20, 21)]
    assert ws[-1].latency_source == "ebpf"
    e = explain("svc", {"svc": ws})
    assert e.top_cause == "runqueue_wait"
    assert e.shares["runqueue_wait"] > 0.7


def test_an_old_fault_in_the_baseline_does_not_hide_a_new_one():
    ws = history(n_calm=10, faulty=[(SLOW_TAIL, {"runqueue_s": 60.0})] * 2)
    ws += [window(t) for t in range(12, 30)]
    ws += [window(30, SLOW_TAIL, runqueue_s=60.0)]
    e = explain("svc", {"svc": ws}, recent_s=1.0)
    assert e.top_cause == "runqueue_wait"
    assert e.growth_s == pytest.approx(0.19 - 0.0199)


def test_jitter_goes_to_the_cause_that_moves_with_p99_window_by_window():
    rng = np.random.default_rng(3)
    ws = []
    for t in range(60):
        tail = int(rng.integers(0, 6))
        ws.append(window(t, (0, 100 - tail, 0, 0, tail, 0, 0), runqueue_s=0.5 * tail + 0.01,
                         blocking_s=float(rng.uniform(0.01, 0.5))))
    e = explain("svc", {"svc": ws})
    assert e.jitter_s > 0.01
    assert e.jitter_shares["runqueue_wait"] > 0.7      # P99 is not linear in the tail count: R^2 < 1
    assert sum(e.jitter_shares.values()) <= 1.0 + 1e-9
    assert e.jitter_shares.get("blocking_syscalls", 0.0) < 0.1


def test_too_few_windows_say_warming_up_and_name_no_cause():
    e = explain("svc", {"svc": history(n_calm=3, faulty=[(SLOW_TAIL, {})])}, recent_s=1.0)
    assert "warming up" in e.verdict
    assert e.shares == {} and e.top_cause == "" and e.confidence == 0.0


def test_a_service_that_talks_but_is_never_timed_says_why_not_warming_up():
    # A memcached found by port: TCP traffic, no request a family can time. It said
    # "warming up" for ever, so its caller could never name it.
    talking = {("tcp_rtt", "app"): per_event(0.001)}
    silent = [Window("cache", t, t + 1.0, 0.5, histograms=dict(talking)) for t in range(12)]
    e = explain("cache", {"cache": silent}, recent_s=1.0)
    assert "no request timed" in e.verdict and "HTTP/1, Redis" in e.verdict and "warming up" not in e.verdict
    idle = [Window("cache", t, t + 1.0, 0.5) for t in range(12)]
    assert "warming up" in explain("cache", {"cache": idle}, recent_s=1.0).verdict   # idle: nothing to time yet


def test_a_downstream_that_can_never_be_timed_is_said_at_start_with_the_fix(tmp_path):
    from slotune import config, process
    from slotune.attribution import timeable
    text = """[services.app]
cmdline = "app"
slo_p99_ms = 100
downstream = ["redis", "cache", "api", "web", "pg"]
[services.redis]
port = 6379
slo_p99_ms = 10
[services.cache]
port = 11211
[services.pg]
cmdline = "^/usr/lib/postgresql/16/bin/postgres -D"
[services.web]
cmdline = "web"
[services.api]
cmdline = "api"
port = 6379
slo_p99_ms = 50
metrics_url = "http://127.0.0.1:9/metrics"
latency_metric = "api_request_duration_seconds"
"""
    (tmp_path / "slotune.toml").write_text(text)
    cfg = config.load(tmp_path / "slotune.toml")
    # Every family on (the default): http times HTTP/1, so web can be timed, and redis Redis;
    # memcached and PostgreSQL never; api has its own latency histogram, whatever it speaks.
    lines = timeable.downstream_lines(cfg.services, process.untimeable(cfg))
    assert len(lines) == 2
    assert lines[0] == ("service app: downstream cache cannot be timed, so it is never named as app's cause: found "
                        "by port 11211, it is a memcached server, and no probe family of slotune times memcached "
                        "requests; to time it, give cache a metrics_url with its latency histogram (latency_metric), "
                        "or remove it from app's downstream")
    assert "downstream pg cannot be timed" in lines[1] and "found by cmdline postgres" in lines[1]
    # Without the redis family, Redis is not timed; without http, web is not either, and the line
    # says how to get it.
    assert "redis" in timeable.untimeable(cfg.services, ("HTTP/1",))
    off = timeable.untimeable(cfg.services, ())
    assert sorted(off) == ["app", "cache", "pg", "redis", "web"] and "turn on the http family" in off["web"]


def test_the_daemon_says_each_downstream_that_cannot_be_timed_once_per_config(tmp_path, caplog):
    import logging
    from slotune import config
    from slotune.process import Daemon
    path = tmp_path / "slotune.toml"
    text = f"""[daemon]
audit_log = "{tmp_path}/audit.jsonl"
baseline_store = "{tmp_path}/baselines.sqlite"
[services.cache]
port = 11211
[services.app]
cmdline = "app"
"""
    path.write_text(text)
    daemon = Daemon(config.load(path), collectors=[])
    try:
        assert set(daemon.untimeable) == {"cache"}      # what the explanations are given
        with caplog.at_level(logging.WARNING, logger="slotune.process"):
            path.write_text(text + 'downstream = ["cache"]\n')
            assert daemon.reload()
            said = [r.message for r in caplog.records if "cannot be timed" in r.message]
            assert said and said[0].startswith("service app: downstream cache cannot be timed")
            assert daemon.reload()                        # the same config again: nothing new to say
        assert len([r for r in caplog.records if "cannot be timed" in r.message]) == 1
    finally:
        daemon.close()


def test_a_server_is_known_by_its_usual_port_or_its_program_named_in_the_cmdline():
    from slotune.model import servers
    assert servers.found_as(None, "^/usr/bin/redis-server ")[1] == "cmdline redis-server"
    assert servers.found_as(5432, None)[0].protocol == "PostgreSQL"
    assert servers.found_as(None, "postgres_exporter") is None      # an exporter speaks HTTP
    assert servers.found_as(8000, "uvicorn app:app") is None


def test_a_service_that_can_never_be_timed_says_so_from_the_start_not_warming_up():
    why = "found by port 6379, it is a Redis server; to time it, give redis a metrics_url"
    for n in (2, 40):
        idle = [Window("redis", t, t + 1.0, 0.5) for t in range(n)]
        e = explain("redis", {"redis": idle}, recent_s=1.0, untimeable={"redis": why})
        assert e.verdict == f"redis: cannot be timed: {why}"
    # Where its requests are timed after all (it speaks HTTP on that port), it is explained.
    timed = [window(t, service="redis") for t in range(3)]
    assert "warming up" in explain("redis", {"redis": timed}, recent_s=1.0, untimeable={"redis": why}).verdict


def test_transport_causes_read_tls_handshakes_and_retransmits_per_request():
    calm = {("tls_handshake", ""): per_event(0.0001, 1), ("tcp_rtt", "inference"): per_event(0.003)}
    hand = {("tls_handshake", ""): per_event(0.5), ("tcp_rtt", "inference"): per_event(0.003)}
    ws = [window(t, extra=calm) for t in range(20)] + [window(20, (0, 95, 5, 0, 0, 0, 0), extra=hand)]
    e = explain("svc", {"svc": ws}, recent_s=1.0)
    assert e.top_cause == "tls_handshake"
    assert e.evidence["tls_handshake"].recent == pytest.approx(0.005)
    w = window(0, extra=calm)
    w.counters[("tcp_retransmits", "inference")] = 5.0      # 5 in 100 requests wait one RTO each
    assert attribution.causes.retransmits(w).value_s == pytest.approx(0.05 * attribution.causes.MIN_RTO_S)


def test_status_form_carries_what_the_daemon_exports():
    e = explain("svc", {"svc": history(faulty=[(SLOW_TAIL, {"runqueue_s": 60.0})])}, recent_s=1.0)
    status = e.as_status()
    assert set(status) >= {"verdict", "top_cause", "shares", "confidence", "evidence"}
    assert 0.0 < status["confidence"] <= 1.0
    assert status["top_cause"] == "runqueue_wait"


def test_the_call_graph_comes_from_downstream_lists_and_peers_that_are_services(tmp_path):
    from slotune import config
    path = tmp_path / "slotune.toml"
    path.write_text("""
[services.gateway]
port = 8080
downstream = ["search"]
peers = { "8100" = "inference", "9999" = "elsewhere" }
[services.inference]
port = 8100
[services.search]
port = 8201
""")
    graph = attribution.call_graph(config.load(path).services)
    assert graph == {"gateway": ("search", "inference"), "inference": (), "search": ()}


def test_explain_all_explains_every_service_once_with_the_same_answer_as_explain():
    gateway = history(faulty=[(SLOW_TAIL, {}), (SLOW_TAIL, {})], service="gateway")
    inference = history(faulty=[(SLOW_TAIL, {"runqueue_s": 60.0})] * 2, service="inference")
    hist, graph = {"gateway": gateway, "inference": inference}, {"gateway": ("inference",)}
    every = attribution.explain_all(hist, graph)
    assert set(every) == {"gateway", "inference"}
    assert every["gateway"].downstream["inference"] is every["inference"]
    assert every["gateway"].verdict == explain("gateway", hist, graph).verdict


def test_windows_timed_by_ebpf_while_the_service_histogram_was_missing_are_not_mixed_in():
    ws = history(faulty=[(SLOW_TAIL, {"runqueue_s": 60.0})] * 2)
    ebpf = Window("svc", 5.5, 6.5, 0.5, latency=Histogram.from_values([1e9] * 10), latency_source="ebpf")
    ws.insert(6, ebpf)
    e = explain("svc", {"svc": ws})
    assert e.top_cause == "runqueue_wait"
    assert e.p99_s == pytest.approx(0.19)


def test_batch_queue_wait_counts_only_the_wait_beyond_the_batch_running_ahead():
    def inference(t, wait_ms, compute_ms, runqueue_s=0.001, counts=CALM):
        return window(t, counts, runqueue_s=runqueue_s, extra={
            ("inference_queue_wait_seconds", ""): latency_at(wait_ms),
            ("inference_batch_compute_seconds", ""): latency_at(compute_ms)})
    # Slower batches (CPU contention): the queue wait follows the compute, the run queue explains it.
    ws = [inference(t, 15, 8) for t in range(20)] + [inference(20, 95, 90, runqueue_s=20.0, counts=SLOW_TAIL)]
    e = explain("svc", {"svc": ws}, recent_s=1.0)
    assert e.top_cause == "runqueue_wait"
    assert e.evidence["batch_queue_wait"].rise_s < 0.001
    # A longer batch delay: the wait grows on its own.
    ws = [inference(t, 15, 8) for t in range(20)] + [inference(20, 150, 8, counts=SLOW_TAIL)]
    e = explain("svc", {"svc": ws}, recent_s=1.0)
    assert e.top_cause == "batch_queue_wait"
    assert e.shares["batch_queue_wait"] > 0.7


def test_the_attribute_table_lists_causes_by_share_with_evidence_and_path():
    from slotune.commands.attribute import render
    gateway = history(faulty=[(SLOW_TAIL, {}), (SLOW_TAIL, {})], service="gateway")
    inference = history(faulty=[(SLOW_TAIL, {"runqueue_s": 60.0})] * 2, service="inference")
    e = explain("gateway", {"gateway": gateway, "inference": inference}, {"gateway": ["inference"]})
    table = render("gateway", json.loads(json.dumps(e.as_status())))     # as /status carries it
    lines = table.splitlines()
    assert lines[0] == e.verdict
    rows = [line for line in lines if line.startswith(("downstream:", "runqueue_wait", "blocking_syscalls"))]
    assert rows[0].startswith("downstream:inference")
    assert "rest (noise, unexplained)" in table
    assert lines[-1].startswith("path: gateway: downstream:inference") and "inference: runqueue_wait" in lines[-1]


def test_tool_calls_timed_by_a_stalled_caller_do_not_take_the_blame():
    def gateway(t, tool_ms, blocking_s=0.001, counts=CALM):
        return window(t, counts, blocking_s=blocking_s,
                      extra={("gateway_tool_duration_seconds", "tool=search"): latency_at(tool_ms)})
    # The loop blocks 30 ms per request: the tool replies are read 60 ms late, the tool is not slower.
    ws = [gateway(t, 10) for t in range(20)] + [gateway(20, 70, blocking_s=3.0, counts=SLOW_TAIL)]
    e = explain("svc", {"svc": ws}, recent_s=1.0)
    assert e.top_cause == "blocking_syscalls"
    assert e.evidence["tool:search"].rise_s == 0.0
    # The tool itself slows down and nothing in the caller stalls: the tool is named.
    ws = [gateway(t, 10) for t in range(20)] + [gateway(20, 180, counts=SLOW_TAIL)]
    e = explain("svc", {"svc": ws}, recent_s=1.0)
    assert e.top_cause == "tool:search"


def kernel_timed(t, rng, shift_ms=0.0, handshake_s=0.0, n=50) -> Window:
    """A window whose requests the kernel timed (fine buckets) beside the service's own
    coarse histogram, which puts all of them in its (10, 20] ms bucket either way."""
    w = window(t, (0, n, 0, 0, 0, 0, 0))
    w.histograms[("http_request", "")] = Histogram.from_values(
        list((rng.lognormal(np.log(0.013), 0.1, n) + shift_ms / 1e3) * 1e9))
    w.histograms[("tls_handshake", "")] = per_event(handshake_s + 1e-6, n)
    return w


def test_a_few_ms_added_to_every_request_moves_the_p50_and_names_the_per_request_cost():
    # A TLS handshake of 3 ms per request: the P99 of 50 requests hardly notices,
    # their P50 does, and the handshake time per request accounts for it.
    rng = np.random.default_rng(11)
    ws = [kernel_timed(t, rng) for t in range(40)]
    ws += [kernel_timed(t, rng, shift_ms=3.0, handshake_s=50 * 0.003) for t in (40, 41)]
    e = explain("svc", {"svc": ws})
    assert e.moved == "P50" and e.growth_s == pytest.approx(0.003, abs=0.001)
    assert e.top_cause == "tls_handshake" and e.shares["tls_handshake"] > 0.9
    assert e.verdict.startswith("svc P50 +")
    # The service's own histogram alone could not tell: every request stays in (10, 20] ms.
    assert all(w.p(0.5) == ws[0].p(0.5) for w in ws)


def test_a_shift_no_own_cost_accounts_for_must_clear_the_whole_noise_band():
    ws = [kernel_timed(t, np.random.default_rng(t)) for t in range(40)]

    def shifted(handshake_s):     # the same requests, with or without a measured handshake
        return explain("svc", {"svc": ws + [kernel_timed(t, np.random.default_rng(t), 3.0, handshake_s)
                                            for t in (40, 41)]})
    alone, corroborated = shifted(0.0), shifted(50 * 0.003)
    assert alone.moved == corroborated.moved == "P50"
    assert corroborated.noise_s == pytest.approx(alone.noise_s / 2)
    assert alone.growth_s == pytest.approx(corroborated.growth_s)


def test_the_kernel_timing_is_read_only_where_it_saw_the_services_requests():
    def kernel_saw(n: int) -> Window:       # of the 100 requests the service counted in the window
        w = window(0)
        w.histograms[("http_request", "")] = Histogram.from_values([14e6] * n)
        return w
    scraped = kernel_saw(1)                  # one /metrics scrape a second
    assert spans.timing_source([scraped, scraped]) == "service"
    assert spans.request_timing(scraped, "service") is scraped.latency
    assert spans.timing_source([kernel_saw(90), scraped]) == "service"    # 91 of 200
    # A map read and a scrape split the seconds differently: counted over the windows.
    assert spans.timing_source([kernel_saw(70), kernel_saw(125)]) == "ebpf"


def test_a_shift_downstream_is_read_as_the_callees_own_p50_shift():
    # Every gateway request waits 3 ms more on the callee, whose P50 moved by those
    # 3 ms while its P99 stayed where it was: the callee is credited by its P50 shift.
    def kernel_only(t, service, shift_ms):
        w = kernel_timed(t, np.random.default_rng(t), shift_ms)
        w = dataclasses.replace(w, service=service)   # windows are immutable
        w.histograms.pop(("tls_handshake", ""))
        return w
    gateway = [kernel_only(t, "gateway", 3.0 if t >= 40 else 0.0) for t in range(42)]
    callee = [kernel_only(t, "callee", 3.0 if t >= 40 else 0.0) for t in range(42)]
    e = explain("gateway", {"gateway": gateway, "callee": callee}, {"gateway": ["callee"]})
    assert e.moved == e.downstream["callee"].moved == "P50"
    assert e.evidence["downstream:callee"].signal == "callee P50"
    assert e.top_cause == "downstream:callee"


def queue_wait(ms: float, n: int) -> dict:
    return {("svc_queue_wait_seconds", ""): latency_at(ms, n)}


def test_more_requests_coming_is_named_as_offered_load_with_the_queue_it_built():
    # 100 requests a second, then 200 whose tail grew and whose queue wait rose from 5 to 150 ms:
    # the load explains the queue (and the rest of the growth nothing else explains).
    surge = (0, 180, 0, 0, 20, 0, 0)
    ws = history(faulty=[(surge, {"extra": queue_wait(150, 200)})] * 2, extra=queue_wait(5, 100))
    e = explain("svc", {"svc": ws})
    assert e.top_cause == "offered_load" and e.shares["offered_load"] > 0.8
    assert "batch_queue_wait" not in e.evidence
    assert e.evidence["offered_load"].baseline == pytest.approx(100)
    assert e.evidence["offered_load"].recent == pytest.approx(200)


def test_a_queue_that_grows_at_the_usual_rate_stays_the_batchers_own():
    ws = history(faulty=[(SLOW_TAIL, {"extra": queue_wait(150, 100)})] * 2, extra=queue_wait(5, 100))
    e = explain("svc", {"svc": ws})
    assert e.top_cause == "batch_queue_wait" and "offered_load" not in e.evidence


def test_more_load_without_a_tail_is_no_cause():
    ws = history(faulty=[((0, 200, 0, 0, 0, 0, 0), {})] * 2)
    e = explain("svc", {"svc": ws})
    assert e.top_cause == "" and e.shares.get("offered_load", 0.0) == 0.0


def test_every_dominant_cause_is_named_in_order_of_share():
    ws = history(faulty=[(SLOW_TAIL, {"runqueue_s": 20.001, "blocking_s": 60.001})])
    e = explain("svc", {"svc": ws}, recent_s=1.0)
    assert e.path[-1][1] == "blocking_syscalls" and [p[-1][1] for p in e.also] == ["runqueue_wait"]
    assert e.verdict.endswith(": 75 % blocking_syscalls; 25 % runqueue_wait")
    assert e.as_status()["also"] == [[["svc", "runqueue_wait", pytest.approx(0.25)]]]


def test_load_is_judged_by_the_requests_the_kernel_saw_arrive():
    # The kernel times the requests. A stall downstream, then its backlog answered at once:
    # 150 answers in the recent windows, but 50 arrived in each, as usual: no surge. Then
    # 150 arrive per window and only 50 are answered in time: more load, though the answers
    # come at the usual rate.
    def timed(t, answered, arrived, slow):
        rng = np.random.default_rng(t)
        base = rng.lognormal(np.log(0.013), 0.1, answered) + (np.where(np.arange(answered) % 5 == 0, 0.4, 0.0)
                                                                if slow else 0.0)
        w = window(t, (0, answered, 0, 0, 0, 0, 0))
        w.histograms[("http_request", "")] = Histogram.from_values(list(base * 1e9))
        w.counters[("http_arrived", "")] = float(arrived)
        return w
    calm = [timed(t, 50, 50, False) for t in range(40)]
    released = explain("svc", {"svc": calm + [timed(t, 150, 50, True) for t in (40, 41)]})
    assert released.growth_s > 0.2 and "offered_load" not in released.evidence
    surge = explain("svc", {"svc": calm + [timed(t, 50, 150, True) for t in (40, 41)]})
    assert surge.top_cause == "offered_load"
    assert surge.evidence["offered_load"].recent == pytest.approx(150)
