"""The measured causes attribution weighs, each read from one span of windows
(a Window merged over several intervals) as seconds a request's tail can gain
from it, with the signal values that back the reading: for a request's latency,
and for the time to first token (TTFT) and per output token (TPOT) of a service
that streams tokens. Pure arithmetic."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from slotune.model import labels
from slotune.model.histogram import BucketHistogram, Histogram, add_into, merged
from slotune.model.window import Window
from slotune.model import signals

# Syscall classes (bpf/offcpu.bpf.c) that stall the thread that makes them:
# sleeps, file reads/writes, and the rest (fsync, ...). poll and futex are how
# idle threads wait, net calls on non-blocking sockets return at once.
BLOCKING_CLASSES = ("sleep", "io", "other")
MIN_RTO_S = 0.2           # Linux's smallest retransmission timeout
GPU_GAUGES = ("gpu_saturation_ratio", "gpu_membw_ratio", "gpu_pcie_ratio", "gpu_throttled")


@dataclass(frozen=True)
class Reading:
    value_s: float        # seconds a tail request gains from the cause in this span
    signal: str           # what was read, in users' words
    raw: float            # the signal's own value (for evidence)
    unit: str
    short: str = ""       # the signal in one word, for the verdict ("waiting 14 → 52"); "" = not shown


def _total_s(h) -> float:
    return h.total_ns / 1e9 if hasattr(h, "total_ns") else float(h.total_s)


def _per_request(total_s: float, span: Window) -> float | None:
    return total_s / span.requests if span.requests else None


def runqueue_wait(span: Window) -> Reading | None:
    h = span.histograms.get((signals.RUNQUEUE_WAIT, ""))
    if h is None:
        return None
    v = _per_request(_total_s(h), span)
    return None if v is None else Reading(v, "run-queue wait per request", v, "s")


def blocking_syscalls(span: Window) -> Reading | None:
    total = [_total_s(h) for (sig, label), h in span.histograms.items()
             if sig == signals.OFFCPU and label in BLOCKING_CLASSES]
    if not total:
        return None
    v = _per_request(sum(total), span)
    return None if v is None else Reading(v, "blocking syscall time per request", v, "s")


def _family(span: Window, suffix: str, table: str = "histograms"):
    """A family's series in the span together, by its name's suffix: histograms merged,
    gauges or counters summed; None when the span has none."""
    found = [v for (fam, _), v in getattr(span, table).items() if fam.endswith(suffix)]
    if not found:
        return None
    if table != "histograms":
        return sum(found)
    return merged(found)


def _family_p99(span: Window, suffix: str) -> float | None:
    merged = _family(span, suffix)
    v = merged.quantile(0.99) if merged is not None else math.nan
    return v if math.isfinite(v) else None


def batch_queue_wait(span: Window) -> Reading | None:
    """Queue wait P99 beyond the batch compute P99: a request that waits for its
    batch waits out the batch delay setting plus at most the batch running ahead
    of it, so only the part beyond the compute is the batcher's own doing (slower
    compute shows under run-queue wait or GPU saturation)."""
    wait = _family_p99(span, "_queue_wait_seconds")
    if wait is None:
        return None
    compute = _family_p99(span, "_batch_compute_seconds") or 0.0
    return Reading(max(wait - compute, 0.0), "batching queue wait P99 beyond batch compute P99", wait, "s")


def network_rtt(span: Window) -> Reading | None:
    """Mean smoothed RTT towards the slowest peer: a queue on the path shows in
    every round trip, while the P99 of srtt on loopback is delayed-ACK noise."""
    means = [_total_s(h) / h.count for (sig, _), h in span.histograms.items() if sig == signals.TCP_RTT and h.count]
    if not means:
        return None
    return Reading(max(means), "TCP smoothed RTT, mean (slowest peer)", max(means), "s")


def retransmits(span: Window) -> Reading | None:
    """Each retransmission costs at least the minimum RTO; read as the mean per request."""
    if not any(sig.startswith(signals.TCP_PREFIX) for sig, _ in [*span.histograms, *span.counters]):
        return None
    n = sum(v for (sig, _), v in span.counters.items() if sig == signals.TCP_RETRANSMITS)
    per_req = _per_request(n, span)
    if per_req is None:
        return None
    return Reading(per_req * MIN_RTO_S, "TCP retransmits per request", per_req, "1")


def connect(span: Window) -> Reading | None:
    found = [h for (sig, _), h in span.histograms.items() if sig == signals.TCP_CONNECT]
    if not found and not any(sig.startswith(signals.TCP_PREFIX) for sig, _ in span.histograms):
        return None
    v = _per_request(sum(_total_s(h) for h in found), span)
    return None if v is None else Reading(v, "TCP connect time per request", v, "s")


def tls_handshake(span: Window) -> Reading | None:
    h = span.histograms.get((signals.TLS_HANDSHAKE, ""))
    if h is None and not any(sig.startswith(signals.TLS_PREFIX) for sig, _ in [*span.histograms, *span.counters]):
        return None
    v = _per_request(_total_s(h) if h is not None else 0.0, span)
    return None if v is None else Reading(v, "TLS handshake time per request", v, "s")


def gpu_saturation(span: Window, median_s: float | None = None, of: str = "latency") -> Reading | None:
    """GPU pressure as the larger rise of a GPU ratio times the compute time it
    stretches (the median of what is explained: latency, TTFT or TPOT): a
    saturated GPU slows every kernel."""
    ratios = [span.gauges[(g, "")] for g in GPU_GAUGES if (g, "") in span.gauges]
    if not ratios:
        return None
    p50 = span.p(0.5) if median_s is None else median_s
    return Reading(max(ratios) * (p50 if math.isfinite(p50) else 0.0), f"GPU pressure x median {of}",
                   max(ratios), "ratio")


def tool_readings(span: Window) -> dict[str, Reading]:
    """P99 of each tool call as the caller times it, from <caller>_tool_duration_seconds{tool=NAME}."""
    by_tool: dict[str, Histogram | BucketHistogram] = {}
    for (fam, label), h in span.histograms.items():
        if fam.endswith("_tool_duration_seconds") and (tool := labels.value(label, "tool")):
            add_into(by_tool, tool, h)
    out = {}
    for tool, h in by_tool.items():
        v = h.quantile(0.99)
        if math.isfinite(v):
            out[f"tool:{tool}"] = Reading(v, f"tool {tool} call P99", v, "s")
    return out


# --- token causes: what moves a streaming service's TTFT and TPOT ------------------------
# A decode step takes about one inter-token gap, so the span's median gap is the step's
# time; tokens cost alike whatever their kind (time(step) ~ a + b·tokens + c·seqs with the
# sequences' own cost read as theirs), so a step's time splits between its decodes (one
# token per running sequence: batch width) and its prompt chunks (prefill) by their counts.

def _median(h) -> float | None:
    if h is None or not h.count:
        return None
    v = h.quantile(0.5)
    return v if math.isfinite(v) else None


def _step(span: Window) -> tuple[float, float, float] | None:
    """(step time, tokens per step, sequences per step) of the span, or None."""
    step_s, tokens = _median(span.tpot), _family(span, "_iteration_tokens")
    seqs = _family(span, "_iteration_sequences")
    if step_s is None or tokens is None or not tokens.count:
        return None
    per_step = _total_s(tokens) / tokens.count
    width = (_total_s(seqs) / seqs.count if seqs is not None and seqs.count
             else _family(span, "_num_requests_running", "gauges"))
    if not per_step or width is None:
        return None
    return step_s, per_step, min(width, per_step)


def waiting(span: Window) -> float | None:
    """Sequences waiting for a place in the running batch (the gauges' mean over the span)."""
    return _family(span, "_num_requests_waiting", "gauges")


def in_flight(span: Window) -> float | None:
    """Requests being answered now, by the service's own gauges (the mean over a span)."""
    return _family(span, "_inflight_requests", "gauges")


def queue(span: Window) -> Reading | None:
    """Waiting sequences as the mean wait they mean (Little's law: waiting / the
    rate at which requests leave the queue, one first token each)."""
    waiting_now = waiting(span)
    if waiting_now is None or span.ttft is None:
        return None
    rate = span.ttft.count / span.seconds
    return Reading(waiting_now / rate if rate else 0.0, "sequences waiting for a place in the batch", waiting_now,
                   "1", "waiting")


def prefill(span: Window) -> Reading | None:
    """The share of each step spent on prompt chunks (other requests' prefill, chunked
    beside the decodes), in seconds per step."""
    step = _step(span)
    if step is None:
        return None
    step_s, per_step, width = step
    return Reading(step_s * (per_step - width) / per_step, "prompt tokens per model step", per_step - width, "1",
                   "prefill tokens/step")


def batch_width(span: Window) -> Reading | None:
    """The share of each step spent on the running sequences' decodes, in seconds per step."""
    step = _step(span)
    if step is None:
        return None
    step_s, per_step, width = step
    return Reading(step_s * width / per_step, "sequences per model step (running batch)", width, "1", "running")


def preemption(span: Window) -> Reading | None:
    """A preempted sequence waits again and recomputes its prompt and output so far:
    about one more time to first token, per preemption per request."""
    n = _family(span, "_num_preemptions_total", "counters")
    if n is None or span.ttft is None or not span.ttft.count:
        return None
    per_request = n / span.ttft.count
    return Reading(per_request * (_median(span.ttft) or 0.0), "preemptions per request", per_request, "1",
                   "preemptions/request")


def _gpu_of(which: str) -> Callable[[Window], Reading | None]:
    return lambda span: gpu_saturation(span, _median(getattr(span, which)), which.upper())


# what explains a growth of each: TTFT waits for a place, then for its prompt's steps; TPOT is the step time
TOKEN_CAUSES: dict[str, dict[str, Callable[[Window], Reading | None]]] = {
    "ttft": {"queue": queue, "prefill": prefill, "preemption": preemption, "gpu_saturation": _gpu_of("ttft"),
             "runqueue_wait": runqueue_wait, "network_rtt": network_rtt},
    "tpot": {"batch_width": batch_width, "prefill": prefill, "preemption": preemption,
             "gpu_saturation": _gpu_of("tpot")},
}


# cause name -> how to read it. Downstream services and tools are added per call path.
CAUSES: dict[str, Callable[[Window], Reading | None]] = {
    "runqueue_wait": runqueue_wait,
    "blocking_syscalls": blocking_syscalls,
    "batch_queue_wait": batch_queue_wait,
    "network_rtt": network_rtt,
    "retransmits": retransmits,
    "connect": connect,
    "tls_handshake": tls_handshake,
    "gpu_saturation": gpu_saturation,
}


def read_all(span: Window, of: str = "latency") -> dict[str, Reading]:
    """Every cause of `of` ("latency", "ttft" or "tpot") the span has a signal for."""
    out = {}
    for cause, read in (CAUSES if of == "latency" else TOKEN_CAUSES[of]).items():
        r = read(span)
        if r is not None and math.isfinite(r.value_s):
            out[cause] = r
    if of == "latency":
        out.update(tool_readings(span))
    return out
