"""OpenTelemetry over OTLP/HTTP (protobuf), for users whose backend is an OTel Collector:
each decision operators are shown (daemon/export/sinks.py) as a log record (event
slotune.decision) to <otlp_endpoint>/v1/logs, and every otlp_metrics_interval_s the same
registry /metrics serves to <otlp_endpoint>/v1/metrics, converted family by family (gauge ->
Gauge, counter -> cumulative monotonic Sum), its latency histograms as exponential histograms
from the kernel's slots, named by the semantic conventions where one names them. Needs
the `otlp` extra (opentelemetry-sdk, opentelemetry-exporter-otlp-proto-http; no gRPC)."""
from __future__ import annotations

import logging
import math
import socket
import time
from collections import defaultdict
from importlib import metadata

from slotune.store.audit import Entry, Outcome
from slotune.export.exponential import SCALE, exponential_buckets
from slotune.export.samples import SampleExporter
from slotune.export.sinks import ExportCounters, Outbox
from slotune.model.signals import HTTP_FIRST_BYTE, HTTP_REQUEST, HTTP_WRITE_GAP

log = logging.getLogger(__name__)
TIMEOUT_S = 5.0
SCOPE = "slotune"
EVENT = "slotune.decision"
WARN = frozenset({Outcome.ROLLED_BACK, Outcome.ROLLBACK_FAILED, Outcome.REFUSED})
# The exporters' own loggers: what they say about a failed export goes into our one line.
LOGS_LOGGER = "opentelemetry.exporter.otlp.proto.http._log_exporter"
METRICS_LOGGER = "opentelemetry.exporter.otlp.proto.http.metric_exporter"
# The OpenTelemetry semantic conventions' names (all in seconds, as slotune's) for the signals
# that have one: HTTP (semantic-conventions docs/http/http-metrics.md) and GenAI model servers
# (docs/gen-ai/gen-ai-metrics.md). The others keep slotune's Prometheus names.
SEMCONV = {HTTP_REQUEST: "http.server.request.duration",
           HTTP_FIRST_BYTE: "gen_ai.server.time_to_first_token",
           HTTP_WRITE_GAP: "gen_ai.server.time_per_output_token"}


class _FirstWord:
    """A logging filter that keeps the first thing a logger said since the last clear() (the
    cause, before the retries' story) and lets nothing through: the sink says it once."""

    def __init__(self):
        self.text = ""

    def clear(self) -> None:
        self.text = ""

    def filter(self, record) -> bool:
        self.text = self.text or record.getMessage()
        return False


# One per logger for the process (a filter that says False ends the logger's chain).
_SAID = {name: _FirstWord() for name in (LOGS_LOGGER, METRICS_LOGGER)}
for _name, _filter in _SAID.items():
    logging.getLogger(_name).addFilter(_filter)


def resource_attributes(environment: str) -> dict[str, str]:
    try:
        version = metadata.version("slotune")
    except metadata.PackageNotFoundError:
        version = "unknown"
    return {"service.name": "slotune", "service.version": version, "host.name": socket.gethostname(),
            "deployment.environment.name": environment}


def decision_record(entry: Entry, resource, scope):
    """One audit entry as an OTel log record: the audit line as body, its fields as attributes."""
    from opentelemetry._logs import LogRecord, SeverityNumber
    from opentelemetry.sdk._logs import ReadableLogRecord
    attributes: dict[str, str | float] = {"slotune.service": entry.service, "slotune.tuner": entry.tuner, "slotune.setting": entry.setting,
                  "slotune.outcome": entry.outcome.label, "slotune.reason": entry.reason,
                  "slotune.decision": entry.decision, "slotune.detail": entry.detail}
    attributes |= {f"slotune.{k}": float(v) for k, v in (("old", entry.old), ("new", entry.new)) if v is not None}
    warn = entry.outcome in WARN
    record = LogRecord(timestamp=round(entry.t * 1e9), observed_timestamp=time.time_ns(),
                       severity_number=SeverityNumber.WARN if warn else SeverityNumber.INFO,
                       severity_text="WARN" if warn else "INFO", body=f"slotune {entry.tuner}: {entry.line()}",
                       attributes={k: v for k, v in attributes.items() if v != ""}, event_name=EVENT)
    return ReadableLogRecord(record, resource=resource, instrumentation_scope=scope)


def metrics_data(families, latencies: SampleExporter, resource, scope, start_ns: int, now_ns: int):
    """prometheus_client metric families (registry.collect()) as OTel MetricsData, their
    histograms (all the SampleExporter's) taken slot by slot from it."""
    from opentelemetry.sdk.metrics.export import MetricsData, ResourceMetrics, ScopeMetrics
    metrics = [m for fam in families if (m := _metric(fam, start_ns, now_ns)) is not None]
    metrics += latency_metrics(latencies, start_ns, now_ns)
    return MetricsData([ResourceMetrics(resource, [ScopeMetrics(scope, metrics, "")], "")])


def latency_metrics(latencies: SampleExporter, start_ns: int, now_ns: int) -> list:
    """The exporter's histograms as cumulative exponential histograms, one metric per signal."""
    from opentelemetry.sdk.metrics.export import (AggregationTemporality, Buckets, ExponentialHistogram,
                                                  ExponentialHistogramDataPoint, Metric)
    rows, points = {}, defaultdict(list)
    for signal, row, attributes, h in latencies.histograms():
        zero, offset, counts = exponential_buckets(h)
        rows[signal] = row
        # min and max are not in the slots: None leaves them out of the protobuf.
        points[signal].append(ExponentialHistogramDataPoint(
            attributes, start_ns, now_ns, h.count, h.total_ns / 1e9, SCALE, zero, Buckets(offset, counts),
            Buckets(0, []), 0, None, None))                  # type: ignore[arg-type]
    return [Metric(SEMCONV.get(signal, row.metric), row.help, "s",
                   ExponentialHistogram(points[signal], AggregationTemporality.CUMULATIVE))
            for signal, row in rows.items()]


def _metric(fam, start_ns: int, now_ns: int):
    from opentelemetry.sdk.metrics.export import AggregationTemporality, Gauge, Metric, NumberDataPoint, Sum
    cumulative = AggregationTemporality.CUMULATIVE
    if fam.type in ("gauge", "info", "unknown"):
        points = [NumberDataPoint(s.labels, 0, now_ns, float(s.value)) for s in fam.samples
                  if s.name in (fam.name, fam.name + "_info") and math.isfinite(s.value)]
        data: Gauge | Sum = Gauge(points)
    elif fam.type == "counter":
        points = [NumberDataPoint(s.labels, start_ns, now_ns, float(s.value)) for s in fam.samples
                  if s.name == fam.name + "_total"]
        data = Sum(points, cumulative, True)
    else:          # histograms: latency_metrics(); summaries and state sets: slotune exports none
        return None
    name = fam.name + "_info" if fam.type == "info" else fam.name
    return Metric(name, fam.documentation, "", data) if data.data_points else None


class OtlpExport:
    def __init__(self, endpoint: str, environment: str, registry, latencies: SampleExporter,
                 counters: ExportCounters, metrics_interval_s: float | None):
        from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope
        base = endpoint.rstrip("/")
        self.registry, self.latencies, self.interval_s = registry, latencies, metrics_interval_s
        self.resource = Resource.create(resource_attributes(environment))
        self.scope = InstrumentationScope(SCOPE, str(self.resource.attributes["service.version"]))
        self.started_ns, self.last_metrics = time.time_ns(), -math.inf
        self.log_exporter = OTLPLogExporter(endpoint=f"{base}/v1/logs", timeout=TIMEOUT_S)
        self.metric_exporter = OTLPMetricExporter(endpoint=f"{base}/v1/metrics", timeout=TIMEOUT_S)
        self.decisions = Outbox("otlp_logs", f"{base}/v1/logs", self._send_decisions, counters)
        self.metrics = Outbox("otlp_metrics", f"{base}/v1/metrics", self._send_metrics, counters, batch=1,
                              capacity=2) if metrics_interval_s else None
        log.info("decisions go over OTLP/HTTP to %s/v1/logs%s", base,
                 f", metrics to {base}/v1/metrics every {metrics_interval_s:g} s" if self.metrics else "")

    def decided(self, entries: list[Entry]) -> None:
        self.decisions.offer(entries)

    def tick(self, now: float) -> None:
        """Queue a metrics snapshot when its interval has passed; it is read on the sink's thread."""
        if self.metrics and self.interval_s and now - self.last_metrics >= self.interval_s:
            self.last_metrics = now
            self.metrics.offer([now])

    def _send_decisions(self, batch: list[Entry]) -> None:
        records = [decision_record(e, self.resource, self.scope) for e in batch]
        self._check(LOGS_LOGGER, lambda: self.log_exporter.export(records))

    def _send_metrics(self, batch: list[float]) -> None:
        data = metrics_data(self.registry.collect(), self.latencies, self.resource, self.scope, self.started_ns,
                            time.time_ns())
        self._check(METRICS_LOGGER, lambda: self.metric_exporter.export(data))

    def _check(self, logger: str, export) -> None:
        """export(), raising with what its exporter said when it fails."""
        _SAID[logger].clear()
        if export().name != "SUCCESS":
            raise ConnectionError(_SAID[logger].text or "the endpoint did not take the batch")

    def close(self) -> None:
        for outbox in (self.decisions, self.metrics):
            if outbox:
                outbox.close()
        self.log_exporter.shutdown()
        self.metric_exporter.shutdown()


def start(conf, environment: str, registry, latencies: SampleExporter,
          counters: ExportCounters) -> OtlpExport | None:
    """The OTLP sink, or None (said in one line) when the `otlp` extra is not installed."""
    try:
        import opentelemetry.exporter.otlp.proto.http  # noqa: F401
        import opentelemetry.sdk  # noqa: F401
    except ImportError as exc:
        log.error("export.otlp_endpoint is set but the OTLP exporter is not installed (%s): decisions and "
                  "metrics go to Prometheus only; fix: pip install 'slotune[otlp]'", exc)
        return None
    return OtlpExport(conf.otlp_endpoint, environment, registry, latencies, counters,
                      conf.otlp_metrics_interval_s if conf.otlp_metrics else None)
