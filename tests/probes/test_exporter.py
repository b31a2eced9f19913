"""The Prometheus export of kernel samples: real histograms, bounded labels, the
probe and collector gauges, and output that `promtool check metrics` accepts."""
import http.client
import subprocess

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from slotune.model.sample import Sample
from slotune.export.samples import SIGNALS, SampleExporter, register_signals
from slotune.model.histogram import Histogram
from slotune.model.service import ServiceSpec
from tests.probes.conftest import collected


def scrape(exporter) -> str:
    registry = CollectorRegistry()
    registry.register(exporter)
    return generate_latest(registry).decode()


def test_live_kernel_samples_export_and_pass_promtool(kernel, spawn, tag):
    server = spawn("http_server", tag, 0.005)
    port = int(server.stdout.readline())
    collector = kernel([ServiceSpec("web", cmdline=f"http_server.py {tag}")])
    exporter = SampleExporter()
    exporter.observe(collected(collector).values())
    for _ in range(2):                              # two intervals accumulate
        for _ in range(3):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.request("GET", "/")
            conn.getresponse().read()
            conn.close()
        exporter.observe(collected(collector).values())
    exporter.set_collector_up(collector.name, collector.up)
    exporter.set_probes(collector.attached)
    text = scrape(exporter)

    assert 'slotune_http_request_duration_seconds_count{service="web"} 6.0' in text
    assert 'slotune_http_request_duration_seconds_bucket{le="+Inf",service="web"} 6.0' in text
    assert 'slotune_tcp_connections_opened_total{peer="other",service="web"} 6.0' in text
    assert 'slotune_offcpu_seconds_bucket{le="0.033554432",service="web",syscall="sleep"}' in text
    assert 'slotune_probe_attached{probe="sched:sched_switch"} 1.0' in text
    assert 'slotune_collector_up{collector="kernel"} 1.0' in text
    assert "pid" not in text.replace("rapid", "")
    check = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_counters_and_histograms_are_cumulative():
    exporter = SampleExporter()
    for values in ([1000, 3000], [5000]):
        exporter.observe([Sample("a", "test", 0, 1, histograms={("runqueue_wait", ""): Histogram.from_values(values)},
                                 counters={("tcp_retransmits", "db"): 2.0})])
    text = scrape(exporter)
    assert 'slotune_runqueue_wait_seconds_count{service="a"} 3.0' in text
    assert 'slotune_runqueue_wait_seconds_sum{service="a"} 9e-06' in text
    assert 'slotune_runqueue_wait_seconds_bucket{le="2.048e-06",service="a"} 1.0' in text
    assert 'slotune_tcp_retransmits_total{peer="db",service="a"} 4.0' in text


def test_other_collectors_extend_the_table():
    register_signals({"queue_wait": ("slotune_test_queue_wait_seconds", "stage", "histogram", "a test signal")})
    try:
        exporter = SampleExporter()
        exporter.observe([Sample("a", "test", 0, 1, histograms={("queue_wait", "batch"): Histogram.from_values([10])})])
        assert 'slotune_test_queue_wait_seconds_count{service="a",stage="batch"} 1.0' in scrape(exporter)
    finally:
        SIGNALS.pop("queue_wait")


@pytest.mark.parametrize("row, words", [
    (("slotune_x_seconds", None, "summary", "h"), "not one of"),
    (("x_seconds", None, "histogram", "h"), "must be slotune_"),
    (("slotune_x", None, "counter", "h"), "end in _total"),
    (("slotune_runqueue_wait_seconds", None, "histogram", "h"), "already registered"),
])
def test_bad_signal_rows_are_refused(row, words):
    with pytest.raises(ValueError, match=words):
        register_signals({"new_signal": row})
    assert "new_signal" not in SIGNALS
