"""Windows: which latency a service gets, and merging windows whose latency
came from different sources (a missed scrape falls back to eBPF)."""
import numpy as np

from daemon.model.sample import Sample
from daemon.collectors.service_metrics import parse
from daemon.model.histogram import Histogram
from daemon.model.window import Window, build, merged_latency

EXPOSITION = """# TYPE api_request_duration_seconds histogram
api_request_duration_seconds_bucket{outcome="ok",le="0.1"} 8
api_request_duration_seconds_bucket{outcome="ok",le="1.0"} 10
api_request_duration_seconds_bucket{outcome="ok",le="+Inf"} 10
api_request_duration_seconds_sum{outcome="ok"} 1.5
api_request_duration_seconds_count{outcome="ok"} 10
api_request_duration_seconds_bucket{outcome="error",le="0.1"} 1
api_request_duration_seconds_bucket{outcome="error",le="1.0"} 1
api_request_duration_seconds_bucket{outcome="error",le="+Inf"} 1
api_request_duration_seconds_sum{outcome="error"} 0.05
api_request_duration_seconds_count{outcome="error"} 1
api_request_duration_seconds_bucket{outcome="rejected",le="0.1"} 4
api_request_duration_seconds_bucket{outcome="rejected",le="1.0"} 4
api_request_duration_seconds_bucket{outcome="rejected",le="+Inf"} 4
api_request_duration_seconds_sum{outcome="rejected"} 0.01
api_request_duration_seconds_count{outcome="rejected"} 4
"""


def service_sample():
    hists, counters, gauges = parse(EXPOSITION)
    return Sample("api", "service_metrics", 0.0, 1.0, histograms=hists, counters=counters, gauges=gauges)


def ebpf_sample(values_ns):
    return Sample("api", "kernel", 0.0, 1.0, histograms={("http_request", ""): Histogram.from_values(values_ns)})


def test_the_services_own_histogram_wins_and_outcomes_are_counted():
    w = build("api", 0.5, 0.0, 1.0, [service_sample(), ebpf_sample([1e6] * 3)], "api_request_duration_seconds")
    assert w.latency_source == "service"
    assert w.requests == 11 and w.errors == 1 and w.rejected == 4      # rejected ones are not "served"
    assert 0.1 < w.p(0.99) <= 1.0


def test_without_its_own_histogram_a_service_gets_ebpf_latency():
    w = build("api", 0.5, 0.0, 1.0, [ebpf_sample([20e6] * 10)], "")
    assert w.latency_source == "ebpf" and w.requests == 10
    assert abs(w.p(0.5) - 0.02) < 0.002


def test_merging_mixed_sources_keeps_the_latest_source_only():
    service = build("api", 0.5, 0.0, 1.0, [service_sample()], "api_request_duration_seconds")
    ebpf = build("api", 0.5, 1.0, 2.0, [ebpf_sample([20e6] * 5)], "api_request_duration_seconds")
    merged = merged_latency([service, ebpf, service])
    assert merged.count == 22                                           # the two service windows
    assert merged_latency([service, ebpf]).count == 5                   # the eBPF one, the latest
    assert merged_latency([Window("api", 0, 1, 0.5)]) is None


def test_goodput_counts_answers_within_the_slo_without_errors():
    values = np.r_[np.full(90, 50e6), np.full(10, 900e6)]
    w = Window("api", 0.0, 2.0, 0.5, latency=Histogram.from_values(values), errors=5)
    assert abs(w.slo_miss_ratio - 0.10) < 0.01
    assert abs(w.goodput - (100 * 0.9 - 5) / 2.0) < 0.5
