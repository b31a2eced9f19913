"""Windows: which latency a service gets, and merging windows whose latency
came from different sources (a missed scrape falls back to eBPF)."""
import numpy as np

from slotune.model.sample import Sample
from slotune.collectors.service_metrics import parse
from slotune.model.histogram import Histogram
from slotune.model.service import ServiceSpec
from slotune.model.window import EBPF_TPOT, EBPF_TTFT, Window, build, merged_latency, merged_tokens, resolves

# Its objective on a bound of its own histogram, which therefore resolves it.
API = ServiceSpec("api", metrics_url="http://127.0.0.1:1/metrics", latency_metric="api_request_duration_seconds",
                  slo_p99_s=1.0)

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
    w = build(API, 0.0, 1.0, [service_sample(), ebpf_sample([1e6] * 3)])
    assert w.latency_source == "service"
    assert w.requests == 11 and w.errors == 1 and w.rejected == 4      # rejected ones are not "served"
    assert 0.1 < w.p(0.99) <= 1.0


def test_a_histogram_resolves_an_objective_on_a_bound_or_inside_a_narrow_bucket():
    vllm_itl = parse("""# TYPE itl histogram
itl_bucket{le="0.01"} 5
itl_bucket{le="0.025"} 5
itl_bucket{le="0.05"} 5
itl_bucket{le="0.075"} 5
itl_bucket{le="+Inf"} 5
itl_sum 0.02
itl_count 5
""")[0][("itl", "")]
    assert resolves(vllm_itl, 0.0)                       # no objective: nothing to resolve
    assert resolves(vllm_itl, 0.025) and resolves(vllm_itl, 0.0245)     # on a bound, within 5 %
    assert resolves(vllm_itl, 0.06)                      # inside (0.05, 0.075], 1.5x wide
    assert not resolves(vllm_itl, 0.005)                 # inside (0, 0.01]: a guess
    assert not resolves(vllm_itl, 0.018)                 # inside (0.01, 0.025], 2.5x wide
    assert not resolves(vllm_itl, 0.2)                   # over the last finite bound
    assert resolves(Histogram.from_values([1e6]), 0.005)     # the kernel's slots always do


def test_an_objective_its_own_histogram_cannot_resolve_is_judged_on_the_kernels():
    coarse = ServiceSpec("api", metrics_url=API.metrics_url, latency_metric=API.latency_metric, slo_p99_s=0.3)
    w = build(coarse, 0.0, 1.0, [service_sample(), ebpf_sample([1e6] * 3)])
    assert w.latency_source == "ebpf" and w.requests == 3         # 0.3 s lies inside (0.1, 1.0]
    alone = build(coarse, 0.0, 1.0, [service_sample()])
    assert alone.latency_source == "service" and alone.requests == 11     # no kernel timing: its own, coarse


def test_without_its_own_histogram_a_service_gets_ebpf_latency():
    w = build(ServiceSpec("api"), 0.0, 1.0, [ebpf_sample([20e6] * 10)])
    assert w.latency_source == "ebpf" and w.requests == 10
    assert abs(w.p(0.5) - 0.02) < 0.002


def test_with_ebpf_latency_the_errors_are_the_kernels_5xx():
    status = {("http_status", "2xx"): 7.0, ("http_status", "4xx"): 1.0, ("http_status", "5xx"): 2.0}
    kernel = Sample("api", "kernel", 0.0, 1.0, histograms={("http_request", ""): Histogram.from_values([20e6] * 10)},
                    counters=status)
    assert build(ServiceSpec("api"), 0.0, 1.0, [kernel]).errors == 2
    assert build(API, 0.0, 1.0, [service_sample(), kernel]).errors == 1    # the service's own count wins


def test_merging_mixed_sources_keeps_the_latest_source_only():
    service = build(API, 0.0, 1.0, [service_sample()])
    ebpf = build(API, 1.0, 2.0, [ebpf_sample([20e6] * 5)])
    merged = merged_latency([service, ebpf, service])
    assert merged.count == 22                                           # the two service windows
    assert merged_latency([service, ebpf]).count == 5                   # the eBPF one, the latest
    assert merged_latency([Window("api", 0, 1, 0.5)]) is None


def test_goodput_counts_answers_within_the_slo_without_errors():
    values = np.r_[np.full(90, 50e6), np.full(10, 900e6)]
    w = Window("api", 0.0, 2.0, 0.5, latency=Histogram.from_values(values), errors=5)
    assert abs(w.slo_miss_ratio - 0.10) < 0.01
    assert abs(w.goodput - (100 * 0.9 - 5) / 2.0) < 0.5


def test_goodput_counts_only_requests_that_met_every_declared_token_objective():
    ms = 1e6
    e2e = Histogram.from_values(np.full(100, 2000 * ms))                              # all within 5 s
    ttft = Histogram.from_values(np.r_[np.full(80, 100 * ms), np.full(20, 900 * ms)])  # 20 % over 500 ms
    tpot = Histogram.from_values(np.r_[np.full(950, 20 * ms), np.full(50, 120 * ms)])  # 5 % of gaps over 50 ms
    w = Window("llm", 0.0, 1.0, 5.0, latency=e2e, ttft=ttft, tpot=tpot, slo_ttft_s=0.5, slo_tpot_s=0.05)
    assert abs(w.ttft_miss_ratio - 0.20) < 0.01 and abs(w.tpot_miss_ratio - 0.05) < 0.01
    assert abs(w.goodput - 75) < 1.5                                   # 100 x (1 - 0.20 - 0.05)
    undeclared = Window("llm", 0.0, 1.0, 5.0, latency=e2e, ttft=ttft, tpot=tpot)
    assert undeclared.goodput == 100                                   # timings kept, nothing declared


def test_token_timing_comes_from_the_services_own_histograms_else_the_kernel():
    own = Sample("llm", "service_metrics", 0.0, 1.0, histograms={
        ("llm_ttft_seconds", 'model="a"'): Histogram.from_values([100e6] * 3),
        ("llm_ttft_seconds", 'model="b"'): Histogram.from_values([200e6] * 2)})
    kernel = Sample("llm", "kernel", 0.0, 1.0, histograms={
        EBPF_TTFT: Histogram.from_values([300e6] * 7), EBPF_TPOT: Histogram.from_values([10e6] * 40)})
    spec = ServiceSpec("llm", metrics_url="http://127.0.0.1:1/metrics", ttft_metric="llm_ttft_seconds",
                       slo_ttft_p99_s=0.5, slo_tpot_p99_s=0.05)
    w = build(spec, 0.0, 1.0, [own, kernel])
    assert w.ttft.count == 5 and w.tpot.count == 40                    # its own TTFT, the kernel's gaps
    assert (w.ttft_source, w.tpot_source) == ("service", "ebpf")
    assert (w.slo_ttft_s, w.slo_tpot_s) == (0.5, 0.05)
    assert build(ServiceSpec("llm"), 0.0, 1.0, [kernel]).ttft.count == 7


def test_token_timings_from_two_sources_merge_only_the_latest_ones_kind():
    own = parse("""# TYPE llm_ttft_seconds histogram
llm_ttft_seconds_bucket{le="0.1"} 2
llm_ttft_seconds_bucket{le="1.0"} 3
llm_ttft_seconds_bucket{le="+Inf"} 3
llm_ttft_seconds_sum 0.9
llm_ttft_seconds_count 3
""")[0][("llm_ttft_seconds", "")]
    kernel = Histogram.from_values([300e6] * 7)
    ws = [Window("llm", t, t + 1, 5.0, ttft=h) for t, h in enumerate((own, kernel, own, own))]
    assert merged_tokens(ws, "ttft").count == 9              # the three of the service's own kind
    assert merged_tokens(ws[:2], "ttft").count == 7          # the kernel's, the latest
    assert merged_tokens([Window("llm", 0, 1, 5.0)], "tpot") is None
