"""Metrics and decisions over OTLP/HTTP, against a stand-in for an OpenTelemetry Collector (none
can be installed here) that takes only what the OTLP specification's OTLP/HTTP section asks
(open-telemetry/opentelemetry-proto docs/specification.md; https://opentelemetry.io/docs/specs/otlp/#otlphttp):
POST to /v1/metrics and /v1/logs, Content-Type application/x-protobuf, the body an
ExportMetricsServiceRequest / ExportLogsServiceRequest, answered 200 with the matching
Export*ServiceResponse in the same encoding. It decodes the bodies with the protobuf classes
of opentelemetry-proto (installed with the exporter), and the test compares what arrived
with the daemon's own /metrics and audit log."""
import logging
import socket
import sys
import time

import numpy as np
import pytest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (ExportLogsServiceRequest,
                                                                    ExportLogsServiceResponse)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (ExportMetricsServiceRequest,
                                                                          ExportMetricsServiceResponse)
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client import generate_latest

from slotune.store.audit import Outcome
from slotune.export import sinks
from slotune.model.histogram import Histogram
from slotune.model.sample import Sample
from slotune.model.signals import HTTP_FIRST_BYTE, HTTP_REQUEST, HTTP_WRITE_GAP, RUNQUEUE_WAIT
from reference_stack.launcher import free_ports
from tests.export.conftest import Listener, metric_value, steps, wait_for
from tests.export.quantiles import exponential_quantile

SIGNALS = {"/v1/metrics": (ExportMetricsServiceRequest, ExportMetricsServiceResponse),
           "/v1/logs": (ExportLogsServiceRequest, ExportLogsServiceResponse)}


class Collector:
    """The stand-in: decoded requests by path."""

    def __init__(self):
        self.got = {path: [] for path in SIGNALS}
        self.refused: list[str] = []
        self.server = Listener(self.answer)
        self.url = self.server.url

    def answer(self, method, path, headers, body):
        if method != "POST" or path not in SIGNALS:
            self.refused.append(f"{method} {path}")
            return 404, {}, b""
        if headers.get("Content-Type") != "application/x-protobuf":
            self.refused.append(f"{path}: Content-Type {headers.get('Content-Type')}")
            return 415, {}, b""
        request, response = SIGNALS[path]
        self.got[path].append(request.FromString(body))
        return 200, {"Content-Type": "application/x-protobuf"}, response().SerializeToString()

    def metrics(self) -> dict:
        """name -> the last Metric of that name received."""
        return {m.name: m for req in self.got["/v1/metrics"] for rm in req.resource_metrics
                for sm in rm.scope_metrics for m in sm.metrics}

    def log_records(self) -> list:
        return [r for req in self.got["/v1/logs"] for rl in req.resource_logs for sl in rl.scope_logs
                for r in sl.log_records]


def attrs(kv_list) -> dict:
    out = {}
    for kv in kv_list:
        kind = kv.value.WhichOneof("value")
        out[kv.key] = getattr(kv.value, kind)
    return out


@pytest.fixture
def collector():
    c = Collector()
    yield c
    c.server.close()


def otlp_to(url: str) -> str:
    return f"""
        [export]
        otlp_endpoint = "{url}"
        otlp_metrics_interval_s = 1
        """


def test_metrics_and_decisions_arrive_as_the_otlp_requests(make_daemon, collector):
    daemon, latency = make_daemon(otlp_to(collector.url))
    clock = [time.time()]
    latency.p99_s = 0.5                                   # over the SLO: a pushed decision
    entries = steps(daemon, clock, 3)
    pushed = [e for e in entries if e.outcome == Outcome.PUSHED]
    assert pushed
    wait_for(lambda: len(collector.log_records()) == len(pushed) and collector.got["/v1/metrics"],
             "the decisions and a metrics snapshot at the stand-in")
    assert not collector.refused, collector.refused

    for req in collector.got["/v1/metrics"] + collector.got["/v1/logs"]:
        for envelope in list(getattr(req, "resource_metrics", [])) + list(getattr(req, "resource_logs", [])):
            resource = attrs(envelope.resource.attributes)
            assert resource["service.name"] == "slotune" and resource["host.name"] == socket.gethostname()
            assert resource["deployment.environment.name"] == "export-test"

    # The metrics: a snapshot taken after the last interval, against what /metrics serves now.
    before = len(collector.got["/v1/metrics"])
    daemon.sinks.tick(clock[0] + 60)
    wait_for(lambda: len(collector.got["/v1/metrics"]) > before, "a fresh snapshot")
    metrics = collector.metrics()
    scraped = {f.name: f for f in text_string_to_metric_families(generate_latest(daemon.registry).decode())}
    assert {"slotune_service_requests", "slotune_service_latency_seconds", "slotune_tuner_decisions",
            "http.server.request.duration", "slotune_collector_up", "slotune_setting_value"} <= set(metrics)
    requests = metrics["slotune_service_requests"]
    assert requests.WhichOneof("data") == "sum" and requests.sum.is_monotonic
    assert requests.sum.aggregation_temporality == 2                     # cumulative
    assert requests.sum.data_points[0].as_double == scraped["slotune_service_requests"].samples[0].value > 0
    decisions = {attrs(p.attributes)["outcome"]: p.as_double for p in metrics["slotune_tuner_decisions"].sum.data_points}
    assert decisions.get("pushed", 0) >= 1
    assert metrics["slotune_service_latency_seconds"].WhichOneof("data") == "gauge"
    hist = metrics["http.server.request.duration"].exponential_histogram.data_points[0]
    scraped_count = {s.name: s.value for s in scraped["slotune_http_request_duration_seconds"].samples}
    assert hist.count == scraped_count["slotune_http_request_duration_seconds_count"] > 0
    assert hist.sum == pytest.approx(scraped_count["slotune_http_request_duration_seconds_sum"])
    assert hist.zero_count + sum(hist.positive.bucket_counts) == hist.count
    setting = metrics["slotune_setting_value"].gauge.data_points[0]
    assert attrs(setting.attributes) == {"service": "api", "setting": "rate_limit_rps"}

    # The decisions: one log record each, its fields those of the audit line.
    for entry, record in zip(pushed, collector.log_records()):
        fields = attrs(record.attributes)
        assert record.event_name == "slotune.decision" and record.time_unix_nano == round(entry.t * 1e9)
        assert record.severity_text == "INFO" and f"{entry.old:g} -> {entry.new:g}" in record.body.string_value
        assert fields == {"slotune.service": "api", "slotune.tuner": "throttle", "slotune.setting": "rate_limit_rps",
                          "slotune.outcome": "pushed", "slotune.old": entry.old, "slotune.new": entry.new,
                          "slotune.reason": entry.reason, "slotune.decision": entry.decision}
    wait_for(lambda: metric_value(daemon, "slotune_export_sent_total", sink="otlp_logs") == len(pushed),
             "the decisions counted as sent")
    print(f"OTLP metrics: {len(metrics)} families; decision log: {collector.log_records()[0].body.string_value}")


def test_latency_histograms_arrive_as_exponential_histograms_under_the_semantic_convention_names(
        make_daemon, collector):
    daemon, _ = make_daemon(otlp_to(collector.url))
    rng = np.random.default_rng(5)
    values = {   # ns, as the kernel times them: a streaming LLM server's answers, first tokens, token gaps
        HTTP_REQUEST: rng.lognormal(np.log(4e9), 0.5, 2000), HTTP_FIRST_BYTE: rng.lognormal(np.log(150e6), 0.3, 2000),
        HTTP_WRITE_GAP: rng.lognormal(np.log(25e6), 0.4, 50_000), RUNQUEUE_WAIT: rng.lognormal(np.log(20e3), 1.0, 5000)}
    daemon.exporter.observe([Sample("llm", "kernel", 0, 1, histograms={
        (signal, ""): Histogram.from_values(v) for signal, v in values.items()})])
    daemon.sinks.tick(time.time())
    wait_for(lambda: collector.got["/v1/metrics"], "a metrics snapshot")
    assert not collector.refused, collector.refused
    metrics = collector.metrics()

    names = {HTTP_REQUEST: "http.server.request.duration", HTTP_FIRST_BYTE: "gen_ai.server.time_to_first_token",
             HTTP_WRITE_GAP: "gen_ai.server.time_per_output_token",
             RUNQUEUE_WAIT: "slotune_runqueue_wait_seconds"}           # no convention: slotune's name
    assert not {"slotune_http_request_duration_seconds", "slotune_http_first_byte_seconds",
                "slotune_http_write_gap_seconds"} & set(metrics)
    for signal, name in names.items():
        metric = metrics[name]
        assert metric.WhichOneof("data") == "exponential_histogram" and metric.unit == "s", name
        assert metric.exponential_histogram.aggregation_temporality == 2              # cumulative
        (point,) = metric.exponential_histogram.data_points
        assert attrs(point.attributes) == {"service": "llm"}
        assert point.count == len(values[signal]) and point.scale == 4
        assert point.sum == pytest.approx(values[signal].sum() / 1e9)
        assert point.zero_count + sum(point.positive.bucket_counts) == point.count
        p99 = exponential_quantile(0.99, point.scale, point.zero_count, point.positive.offset,
                                   point.positive.bucket_counts)
        assert p99 == pytest.approx(np.quantile(values[signal], 0.99) / 1e9, rel=0.05), name


def test_a_collector_that_is_down_is_counted_said_once_and_the_loop_goes_on(make_daemon, caplog):
    caplog.set_level(logging.INFO, logger="slotune.export.sinks")
    url = f"http://127.0.0.1:{free_ports(1)[0]}"
    daemon, latency = make_daemon(otlp_to(url))
    clock = [time.time()]
    latency.p99_s = 0.5
    began = time.monotonic()
    steps(daemon, clock, 4)
    assert time.monotonic() - began < 3.0

    def said() -> list[str]:
        return [r.getMessage() for r in caplog.records if "export otlp" in r.getMessage() and "failed" in r.getMessage()]

    # Each sink's thread says its failure, then counts it: wait for both, for each signal.
    wait_for(lambda: metric_value(daemon, "slotune_export_failed_total", sink="otlp_logs") >= 1
             and metric_value(daemon, "slotune_export_failed_total", sink="otlp_metrics") >= 1
             and len(said()) >= 2, "counted and said failures", timeout_s=20)
    steps(daemon, clock, 2)
    wait_for(lambda: metric_value(daemon, "slotune_export_failed_total", sink="otlp_metrics") >= 2,
             "a later failure counted", timeout_s=20)
    assert len(said()) == 2 and all(url in s and "Connection refused" in s for s in said()), said()   # once per signal


def test_without_the_otlp_extra_one_line_says_so_and_the_rest_runs(make_daemon, caplog, monkeypatch):
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http", None)   # as if not installed
    caplog.set_level(logging.INFO, logger="slotune.export.otlp")
    daemon, latency = make_daemon(otlp_to("http://collector.example:4318"))
    assert daemon.sinks.sinks == []
    said = [r for r in caplog.records if r.name == "slotune.export.otlp"]
    assert len(said) == 1 and "pip install 'slotune[otlp]'" in said[0].getMessage()
    latency.p99_s = 0.5
    assert any(e.outcome == Outcome.PUSHED for e in steps(daemon, [time.time()], 2))
    assert isinstance(daemon.sinks, sinks.Sinks)
