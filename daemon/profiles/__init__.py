"""Service profiles: for each product slotune knows (vLLM, HAProxy, ...), one small
declarative module says which of its own metrics mean which signal, and how to read
them; which settings it has, which actuator pushes each and whether it is live or
restart-only; the SLOs that fit it; and how `slotune discover` recognises it. This
module holds the shapes, the vocabulary of signals and the registry; nothing else
in the daemon names a product.

A profile's signals reach the rest of the daemon under one family name each,
`<profile>_<signal>` (vllm_queue_wait_seconds), so that the readers of windows find
them by the signal's suffix whatever the product calls it. The reference profile
declares its signals by suffix and keeps its families' own names."""
from __future__ import annotations

import importlib
import math
from dataclasses import dataclass, field

import numpy as np

from slotune.model import labels
from slotune.model.histogram import BucketHistogram
from slotune.model.sample import Key

# signal -> what it means. The name is the family suffix the readers look for.
SIGNALS = {
    "request_duration_seconds": "end-to-end latency per request (histogram)",
    "request_duration_mean_seconds": "mean latency where the product keeps no distribution: a histogram with "
                                     "a count and a sum only (Triton), or a gauge (HAProxy's last 1024)",
    "time_to_first_token_seconds": "time to first token, TTFT (histogram)",
    "inter_token_latency_seconds": "time per output token, TPOT / ITL (histogram)",
    "queue_wait_seconds": "time a request waits before it runs (histogram)",
    "queue_wait_mean_seconds": "mean queue wait, as request_duration_mean_seconds",
    "batch_size": "requests per executed batch (mean, with the batches as its count)",
    "batch_compute_seconds": "compute time per batch",
    "inflight_requests": "requests being answered now (gauge)",
    "num_requests_running": "requests in the running batch (gauge)",
    "num_requests_waiting": "requests waiting for their turn (gauge)",
    "kv_cache_usage_ratio": "share of the KV cache in use, 0..1 (gauge)",
    "num_preemptions_total": "sequences preempted because the KV cache was full (counter)",
    "iteration_tokens": "tokens per model step, prefill chunks and decodes (histogram)",
    "iteration_sequences": "sequences per model step, the running-batch width (histogram)",
    "requests_total": "requests answered (counter)",
    "errors_total": "requests answered with an error (counter)",
    # the reference gateway's own, read by suffix (see reference.py)
    "traces_total": "requests by whether their trace was kept (counter, label sampled)",
    "tool_calls_total": "tool calls by outcome (counter, labels tool, outcome)",
    "breaker_open": "1 while a tool's circuit breaker is open (gauge, label tool)",
    "tool_duration_seconds": "tool call time (histogram, label tool)",
    "stage_duration_seconds": "time per stage of a request (histogram, label stage)",
}
SLO_KEYS = {"p99": "slo_p99_ms", "ttft": "slo_ttft_p99_ms", "tpot": "slo_tpot_p99_ms"}
WINDOW_SIGNALS = {"latency_metric": "request_duration_seconds", "ttft_metric": "time_to_first_token_seconds",
                  "tpot_metric": "inter_token_latency_seconds"}   # ServiceSpec key -> the signal it names


# --- how one signal is read from the service's exposition -----------------------------
@dataclass(frozen=True)
class Histogram:
    """A histogram family, under the first of its names the service exports (a newer
    version's, then an older one's); unit_s: seconds per unit of its bounds (Envoy: ms)."""
    names: tuple[str, ...]
    unit_s: float = 1.0

    def families(self) -> tuple[str, ...]:
        return self.names


@dataclass(frozen=True)
class Gauge:
    """Gauges, added per label set (running + waiting = in flight)."""
    names: tuple[str, ...]
    where: tuple[tuple[str, str | tuple[str, ...]], ...] = ()   # only the series with these label values
    scale: float = 1.0

    def families(self) -> tuple[str, ...]:
        return self.names


def total(name: str) -> str:
    """A counter's name as it is read: with _total, which the parser adds where the
    product leaves it out (Triton, TGI)."""
    return name if name.endswith("_total") else name + "_total"


@dataclass(frozen=True)
class Counter:
    """A cumulative counter, as the product's documentation names it."""
    name: str
    where: tuple[tuple[str, str | tuple[str, ...]], ...] = ()   # label -> its value, or one of several

    def families(self) -> tuple[str, ...]:
        return (total(self.name),)


@dataclass(frozen=True)
class Ratio:
    """Two cumulative counters read as a mean over the interval, scale x Δtotal / Δper,
    handed on as a histogram that knows only its count (Δcount, default Δper) and sum:
    its mean is exact, its quantiles unknown. Triton's batch size is Ratio of
    nv_inference_count over nv_inference_exec_count."""
    total: str
    per: str
    scale: float = 1.0
    count: str = ""

    def families(self) -> tuple[str, ...]:
        return tuple(total(f) for f in (self.total, self.per, self.count) if f)


@dataclass(frozen=True)
class Suffix:
    """Every family whose name ends in the signal's own suffix, under its own name
    (the reference stack's: it was built with slotune's vocabulary)."""


Reading = Histogram | Gauge | Counter | Ratio | Suffix


@dataclass(frozen=True)
class Setting:
    """One setting of the product, under slotune's name for it (the [settings.NAME] key
    tuners push). kind: the actuator that pushes it ([control] kind); target: what it is
    on the product, in its own words: the form of its [control.targets] entry, or, for a
    restart-only setting, the launch flag slotune recommends."""
    name: str
    kind: str
    target: str
    live: bool = True


@dataclass(frozen=True)
class Profile:
    name: str
    doc: str                                       # the page its names come from
    signals: dict[str, Reading] = field(default_factory=dict)
    settings: tuple[Setting, ...] | None = ()      # None: whatever its control surface takes
    exposition: str = "prometheus"                 # prometheus | stub_status | "" (no metrics: eBPF only)
    metrics_path: str = "/metrics"
    slos: tuple[str, ...] = ("p99",)               # the objectives that fit it (SLO_KEYS)
    processes: tuple[str, ...] = ()                # process names `slotune discover` knows it by
    marks: tuple[str, ...] = ()                    # families only it exports: how discover recognises it
                                                   # (a group in one names the service)
    control: tuple[str, ...] = ()                  # its [control] keys beside kind, as starter lines
    routes: tuple[str, ...] = ()                   # the paths of its work (config `routes`), as discover writes
    #                                                them: its /metrics, /health and the rest are then not judged

    def __post_init__(self):
        unknown = set(self.signals) - set(SIGNALS)
        if unknown:
            raise ValueError(f"profile {self.name}: unknown signals {sorted(unknown)}; known: {', '.join(SIGNALS)}")

    def setting(self, name: str) -> Setting | None:
        return next((s for s in self.settings or () if s.name == name), None)

    def family_of(self, signal: str) -> str:
        return f"{self.name}_{signal}"

    def wants(self, name: str) -> bool:
        """Whether a family (or counter sample) of the exposition is one this profile reads."""
        return any(name in r.families() if not isinstance(r, Suffix) else name.endswith("_" + s)
                   for s, r in self.signals.items())

    def default_metrics(self) -> dict[str, str]:
        """The ServiceSpec keys (latency_metric, ...) this profile fills in: its signal's family."""
        return {key: self.family_of(signal) for key, signal in WINDOW_SIGNALS.items()
                if signal in self.signals and not isinstance(self.signals[signal], Suffix)}

    def signals_of(self, hists: dict, counters: dict, gauges: dict) -> tuple[dict, dict, dict]:
        """One interval's deltas of the service's own series -> its signals, keyed
        (family_of(signal), labels). Series of no signal are dropped."""
        out_h: dict = {}
        out_c: dict = {}
        out_g: dict = {}
        for signal, r in self.signals.items():
            fam = self.family_of(signal)
            if isinstance(r, Suffix):
                suffix = "_" + signal
                for table, out in ((hists, out_h), (counters, out_c), (gauges, out_g)):
                    out.update({k: v for k, v in table.items() if k[0].endswith(suffix)})
            elif isinstance(r, Histogram):
                found = next((n for n in r.names if any(f == n for f, _ in hists)), None)
                out_h.update({(fam, lab): _scaled(h, r.unit_s) for (f, lab), h in hists.items() if f == found})
            elif isinstance(r, Gauge):
                for (f, lab), v in gauges.items():
                    if f in r.names and _matches(lab, r.where):
                        key = (fam, _without(lab, r.where))
                        out_g[key] = out_g.get(key, 0.0) + v * r.scale
            elif isinstance(r, Counter):
                for (f, lab), v in counters.items():
                    if f == total(r.name) and _matches(lab, r.where):
                        key = (fam, _without(lab, r.where))
                        out_c[key] = out_c.get(key, 0.0) + v
            elif isinstance(r, Ratio):
                out_h.update(_ratio(fam, r, counters))
        return out_h, out_c, out_g


def _matches(label: str, where) -> bool:
    """Whether the label set has each key of `where` at its value (or one of its values, a tuple)."""
    return all(labels.value(label, k) in (v if isinstance(v, tuple) else (v,)) for k, v in where)


def _without(label: str, where) -> str:
    """The label set less the keys `where` fixed (they say nothing once chosen)."""
    if not where:
        return label
    fixed = {k for k, _ in where}
    return ",".join(p for p in label.split(",") if p and p.partition("=")[0] not in fixed)


def _scaled(h: BucketHistogram, unit_s: float) -> BucketHistogram:
    if unit_s == 1.0:
        return h
    return BucketHistogram(tuple(b * unit_s for b in h.bounds_s), h.counts, h.total_s * unit_s)


def summary(count: float, total: float) -> BucketHistogram:
    """A histogram of `count` observations adding up to `total`, with no bucket but +Inf."""
    return BucketHistogram((math.inf,), np.array([float(count)]), float(total))


def _ratio(fam: str, r: Ratio, counters: dict) -> dict[Key, BucketHistogram]:
    out = {}
    for (f, lab), per in counters.items():
        if f != total(r.per) or per <= 0:
            continue
        added = counters.get((total(r.total), lab))
        count = counters.get((total(r.count), lab)) if r.count else per
        if added is None or count is None or count <= 0:
            continue
        out[(fam, lab)] = summary(count, r.scale * added / per * count)
    return out


# --- the registry ------------------------------------------------------------------------
NAMES = ("reference", "vllm", "sglang", "tgi", "triton", "ollama", "llamacpp", "haproxy", "nginx", "envoy", "litellm")
DEFAULT = "reference"


def get(name: str) -> Profile:
    """The profile of that name; KeyError (naming the known ones) for another."""
    if name not in NAMES:
        raise KeyError(f"unknown profile {name!r}; one of {', '.join(NAMES)}")
    return importlib.import_module(f"slotune.profiles.{name}").PROFILE


def every() -> list[Profile]:
    return [get(n) for n in NAMES]
