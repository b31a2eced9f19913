"""The P99 a reader gets back from what slotune exports, against the exact P99 of the values
the kernel histogram counted: distributions of four shapes, each at medians from 20 µs to
2 s (every placement against the slots), built into the kernel histogram type. Prometheus:
through the real exporter, its text parsed by prometheus_client's parser, read as
PromQL's histogram_quantile reads buckets. OTLP: the exponential buckets it sends, read
the same way. Run with -s for the figures docs/operations.md quotes."""
import math
import time

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import slotune.collectors.kernel.families  # noqa: F401  (registers the kernel's signals)
from slotune.config import ExportConf
from slotune.export.exponential import SCALE, exponential_buckets
from slotune.export.samples import SampleExporter
from slotune.model.histogram import BUCKETS_PER_OCTAVE, SUB, Histogram, export_bounds
from slotune.model.sample import Sample
from slotune.model.signals import (HTTP_FIRST_BYTE, HTTP_REQUEST, HTTP_WRITE_GAP, OFFCPU, RUNQUEUE_WAIT,
                                   TCP_CONNECT, TCP_RTT)
from tests.export.quantiles import exponential_quantile, histogram_quantile

N = 10_000
MEDIANS_NS = np.geomspace(20e3, 2e9, 13)
SHAPES = {   # name -> values (ns) around a median m
    "narrow (lognormal σ 0.1)": lambda rng, m: rng.lognormal(math.log(m), 0.1, N),
    "wide (lognormal σ 1)": lambda rng, m: rng.lognormal(math.log(m), 1.0, N),
    "bimodal (90 % at m, 10 % at 20 m)": lambda rng, m: np.r_[rng.lognormal(math.log(m), 0.2, N * 9 // 10),
                                                               rng.lognormal(math.log(20 * m), 0.2, N // 10)],
    "heavy tail (Pareto α 1.5)": lambda rng, m: m * (1 + rng.pareto(1.5, N)),
}
# Narrower than a slot: the slots' width bounds what any reader can get back.
NARROWER = {"narrower (lognormal σ 0.05)": lambda rng, m: rng.lognormal(math.log(m), 0.05, N)}
SLOT_WIDTH = 1 / SUB     # a slot's width over its low edge, at most
WITHIN = 0.05


def distributions(shapes) -> dict[str, list[np.ndarray]]:
    rng = np.random.default_rng(40)
    return {name: [make(rng, m) for m in MEDIANS_NS] for name, make in shapes.items()}


DISTRIBUTIONS = distributions({**SHAPES, **NARROWER})
HISTOGRAMS = {name: [Histogram.from_values(v) for v in values] for name, values in DISTRIBUTIONS.items()}


def scraped_buckets(per_octave: int, histograms: list[Histogram]) -> list[list[tuple[float, float]]]:
    """Each histogram exported as one service's HTTP request latency, the exposition parsed back."""
    exporter = SampleExporter(export_bounds(per_octave))
    exporter.observe([Sample(f"s{i:03d}", "kernel", 0, 1, histograms={(HTTP_REQUEST, ""): h})
                      for i, h in enumerate(histograms)])
    registry = CollectorRegistry()
    registry.register(exporter)
    by_service: dict[str, list[tuple[float, float]]] = {}
    for fam in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in fam.samples:
            if s.name == "slotune_http_request_duration_seconds_bucket":
                by_service.setdefault(s.labels["service"], []).append((float(s.labels["le"]), s.value))
    return [by_service[f"s{i:03d}"] for i in range(len(histograms))]


def prometheus_errors(per_octave: int) -> dict[str, float]:
    """Each shape's worst |read P99 / exact P99 - 1| over its placements."""
    out = {}
    for name, values in DISTRIBUTIONS.items():
        read = [histogram_quantile(0.99, b) * 1e9 for b in scraped_buckets(per_octave, HISTOGRAMS[name])]
        out[name] = max(abs(r / np.quantile(v, 0.99) - 1) for r, v in zip(read, values))
    return out


def test_prometheus_p99_is_within_5_percent_on_the_default_buckets():
    per_octave = ExportConf().buckets_per_octave
    errors = {p: prometheus_errors(p) for p in BUCKETS_PER_OCTAVE}
    print(f"\nworst P99 error read back with histogram_quantile, {len(MEDIANS_NS)} placements each:")
    for name in DISTRIBUTIONS:
        print(f"  {name:36s}" + "".join(f"  {p}/octave {errors[p][name] * 100:5.1f} %" for p in BUCKETS_PER_OCTAVE))
    for name in SHAPES:
        assert errors[per_octave][name] <= WITHIN, (name, errors[per_octave][name])
    for name in NARROWER:
        assert errors[per_octave][name] <= SLOT_WIDTH, (name, errors[per_octave][name])
    assert max(errors[4][name] for name in SHAPES) > WITHIN       # the coarser layout this replaced


def test_otlp_exponential_buckets_keep_every_observation_and_the_p99():
    worst = {}
    for name in SHAPES:
        for values, h in zip(DISTRIBUTIONS[name], HISTOGRAMS[name]):
            zero, offset, counts = exponential_buckets(h)
            assert zero + sum(counts) == h.count and min(counts) >= 0 and counts[0] and counts[-1]
            error = abs(exponential_quantile(0.99, SCALE, zero, offset, counts) * 1e9 / np.quantile(values, 0.99) - 1)
            worst[name] = max(worst.get(name, 0.0), error)
    print("\nworst P99 error read back from the OTLP exponential buckets (scale %d): %s"
          % (SCALE, ", ".join(f"{name} {e * 100:.1f} %" for name, e in worst.items())))
    assert max(worst.values()) <= WITHIN, worst
    zeros = Histogram.from_values([0, 0, 3000])
    assert exponential_buckets(zeros)[0] == 2 and sum(exponential_buckets(zeros)[2]) == 1
    assert exponential_buckets(Histogram()) == (0, 0, [])


# A typical host: three services (gateway, LLM server, tool), each with its HTTP timing, run-queue
# wait, off-CPU time in four syscall classes, TCP RTT to two peers and connect time to one.
TYPICAL = [(HTTP_REQUEST, ""), (HTTP_FIRST_BYTE, ""), (HTTP_WRITE_GAP, ""), (RUNQUEUE_WAIT, ""),
           *((OFFCPU, c) for c in ("net", "poll", "futex", "io")), (TCP_RTT, "db"), (TCP_RTT, "llm"),
           (TCP_CONNECT, "db")]


@pytest.mark.parametrize("per_octave", BUCKETS_PER_OCTAVE)
def test_exposition_size_of_a_typical_host(per_octave):
    rng = np.random.default_rng(1)
    exporter = SampleExporter(export_bounds(per_octave))
    exporter.observe([Sample(service, "kernel", 0, 1, histograms={
        key: Histogram.from_values(rng.lognormal(math.log(5e6), 1.5, 300)) for key in TYPICAL})
        for service in ("gateway", "llm", "tools")])
    registry = CollectorRegistry()
    registry.register(exporter)
    began = time.process_time()
    text = generate_latest(registry).decode()
    cpu_ms = (time.process_time() - began) * 1e3
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    per_series = 26 * per_octave + 3             # the bounds, +Inf, _sum and _count
    assert len(lines) == 3 * len(TYPICAL) * per_series
    print(f"\n{per_octave}/octave: {per_series} series per histogram, {len(lines)} series, "
          f"{len(text.encode()) / 1024:.0f} KiB for {3 * len(TYPICAL)} histograms, {cpu_ms:.0f} ms of CPU to write")
