"""A service whose /metrics answers the same bytes as at the last scrape (at rest) is
not parsed again: its sample is the same as when it was (zero deltas), and a
change of body, or of the families read, is parsed afresh. Real HTTP on loopback."""
import pytest

from slotune.collectors import service_metrics
from slotune.collectors.service_metrics import ServiceMetricsCollector
from slotune.model.service import ServiceSpec
from tests.profiles.test_profiles import Exposition


def body(requests: int) -> str:
    return (f"# TYPE api_request_duration_seconds histogram\n"
            f'api_request_duration_seconds_bucket{{le="0.1"}} {requests}\n'
            f'api_request_duration_seconds_bucket{{le="+Inf"}} {requests}\n'
            f"api_request_duration_seconds_sum {0.05 * requests}\n"
            f"api_request_duration_seconds_count {requests}\n"
            f"# TYPE api_inflight_requests gauge\napi_inflight_requests 2\n")


@pytest.fixture
def parses(monkeypatch):
    """How many bodies the collector parsed."""
    count = [0]
    real = service_metrics.read_exposition

    def counting(*args):
        count[0] += 1
        return real(*args)
    monkeypatch.setattr(service_metrics, "read_exposition", counting)
    return count


def test_the_same_body_is_read_once_and_reads_as_no_change(parses):
    requests = [5, 5, 5, 9, 9]       # at rest, then 4 more requests, then at rest again
    server = Exposition(lambda n: body(requests[min(n, len(requests)) - 1]))
    collector = ServiceMetricsCollector(timeout_s=3.0)
    spec = ServiceSpec("api", metrics_url=server.url, latency_metric="api_request_duration_seconds")
    try:
        collector.start([spec])
        counts = []
        for i in range(len(requests)):
            got = collector.collect(float(i), i + 1.0)
            counts += [s.histograms[("api_request_duration_seconds", "")].count for s in got]
            assert all(s.gauges[("api_inflight_requests", "")] == 2 for s in got)
        assert counts == [0, 0, 4, 0] and parses[0] == 2
        collector.update_services([spec])            # nothing changed: the last body still stands
        collector.collect(5.0, 6.0)
        assert parses[0] == 2
        other = ServiceSpec("api", metrics_url=server.url, latency_metric="api_inflight_requests")
        collector.update_services([other])           # other families read: parsed afresh
        collector.collect(6.0, 7.0)
        assert parses[0] == 3
    finally:
        collector.close()
        server.shutdown()
