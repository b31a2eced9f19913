"""One time-aligned record per service per collection interval: every
collector's Sample for that service merged, plus the service's end-to-end
latency, and for a service that streams tokens its time to first token (TTFT)
and time per output token (TPOT). Each of the three is taken from the service's
own histogram when configured and fine enough around its objective (resolves()),
else from eBPF (whose 429 and 503 answers are refusals, not fast answers; a Redis
server's commands where it speaks no HTTP); the
window says which (latency_source, ttft_source, tpot_source). A Window is built
once and never changed after: later stages share it."""
from __future__ import annotations

import math
from dataclasses import KW_ONLY, dataclass, field
from functools import cached_property

from slotune.model import labels, routes
from slotune.model.histogram import BucketHistogram, Histogram, add_into, merged
from slotune.model.sample import Key, Sample
from slotune.model.service import ServiceSpec
from slotune.model import signals

EBPF_LATENCY: Key = (signals.HTTP_REQUEST, "")
EBPF_TTFT: Key = (signals.HTTP_FIRST_BYTE, "")     # request to the response's first byte: TTFT when it streams
EBPF_TPOT: Key = (signals.HTTP_WRITE_GAP, "")      # between the writes of one response: the inter-token gap
EBPF_ERRORS: Key = (signals.HTTP_STATUS, "5xx")     # server errors, read from the responses' status lines
EBPF_ARRIVED: Key = (signals.HTTP_ARRIVED, "")      # requests read as they came, answered or not yet
REDIS_ERRORS: Key = (signals.REDIS_ERRORS, "")
REDIS_ARRIVED: Key = (signals.REDIS_ARRIVED, "")
EBPF_REFUSED = signals.HTTP_REFUSED                 # the 429 and 503 answers, timed apart (also in EBPF_LATENCY)
EBPF_REFUSED_5XX: Key = (EBPF_REFUSED, "503")  # the refusals among the 5xx
ERROR_OUTCOMES = ("error",)
# A service's own histogram resolves an objective when one of its bounds lies within
# 5 % of it, or two bounds at most 1.5x apart hold it: the share over the objective
# is then read at a bound, or interpolated inside a narrow bucket. vLLM's inter-token
# buckets start at 10 ms and its e2e buckets at 0.3 s: a 5 ms TPOT or a 250 ms
# latency objective falls in a bucket from 0, whose share over it is a guess.
ON_A_BOUND = 0.05
NARROW_BUCKET = 1.5
REJECTED_OUTCOMES = ("rejected",)


@dataclass(frozen=True, eq=False)   # one per service per interval: it is its own identity
class Window:
    service: str
    start: float
    end: float
    slo_p99_s: float
    _: KW_ONLY                        # the rest by name: 11 fields of like types
    latency: Histogram | BucketHistogram | None = None
    latency_source: str = ""          # "service" (its own histogram) | "ebpf" | ""
    ttft_source: str = ""             # the same for ttft and tpot
    tpot_source: str = ""
    errors: float = 0.0
    rejected: float = 0.0
    histograms: dict[Key, Histogram | BucketHistogram] = field(default_factory=dict)
    counters: dict[Key, float] = field(default_factory=dict)
    gauges: dict[Key, float] = field(default_factory=dict)
    slo_ttft_s: float = 0.0           # the token objectives, 0 when not declared
    slo_tpot_s: float = 0.0
    ttft: Histogram | BucketHistogram | None = None   # one value per request
    tpot: Histogram | BucketHistogram | None = None   # one value per gap between two tokens

    @cached_property
    def derived(self) -> dict:
        """What later stages work out of this window, kept with it (its quantiles,
        attribution's statistics): worked out once, as the window never changes.
        Also what a call hands to the next (daemon/model/columns.py), let go when
        the window leaves the daemon's history."""
        return {}

    @cached_property
    def kernel_latency(self) -> Histogram | None:
        """The kernel's timing of the service's requests, whatever they speak: HTTP/1's,
        else a Redis server's commands (blocking ones aside), or None."""
        return kernel_timing(self.histograms)

    @property
    def kernel_arrived(self) -> float:
        """Requests the kernel saw read (answered or not yet), HTTP/1's and Redis's."""
        return self.counters.get(EBPF_ARRIVED, 0.0) + self.counters.get(REDIS_ARRIVED, 0.0)

    @property
    def seconds(self) -> float:
        return max(self.end - self.start, 1e-9)

    @cached_property
    def requests(self) -> int:
        """Requests the latency timed (counted once: the tuners' look-back reads it every second)."""
        return self.latency.count if self.latency is not None else 0

    @property
    def rate(self) -> float:
        return self.requests / self.seconds

    def p(self, q: float) -> float:
        """The latency's q-quantile (NaN without one), worked out once per q: the control
        loop and attribution read the same windows' P99 again every second."""
        known = self.derived
        if ("p", q) not in known:
            known[("p", q)] = self.latency.quantile(q) if self.latency is not None else math.nan
        return known[("p", q)]

    def family(self, name: str) -> Histogram | BucketHistogram | None:
        """Every series of one histogram family merged ("tcp_rtt" over its peers), or None."""
        return _family(self.histograms, name)

    @property
    def slo_miss_ratio(self) -> float:
        return self.latency.fraction_above(self.slo_p99_s) if self.latency is not None else 0.0

    @property
    def ttft_miss_ratio(self) -> float:
        """Share of requests whose first token came later than the TTFT objective."""
        return _miss(self.ttft, self.slo_ttft_s)

    @property
    def tpot_miss_ratio(self) -> float:
        """Share of gaps between tokens longer than the TPOT objective (read as the share
        of requests that missed it: a histogram keeps no request's gaps together)."""
        return _miss(self.tpot, self.slo_tpot_s)

    @property
    def goodput(self) -> float:
        """Requests per second that met every objective the service declares, without
        error (DistServe's goodput). The shares that missed each objective are added: a
        request can miss several, so this is the least the goodput can be."""
        missed = min(self.slo_miss_ratio + self.ttft_miss_ratio + self.tpot_miss_ratio, 1.0)
        good = self.requests * (1.0 - missed) - self.errors
        return max(good, 0.0) / self.seconds


def _miss(hist, objective_s: float) -> float:
    return hist.fraction_above(objective_s) if objective_s > 0 and hist is not None and hist.count else 0.0


def resolves(hist, objective_s: float) -> bool:
    """Whether a service's own histogram can tell the share of values over the
    objective (see ON_A_BOUND); any histogram resolves "no objective", and the
    kernel's log-linear slots (Histogram) are always fine enough."""
    if objective_s <= 0 or not isinstance(hist, BucketHistogram):
        return True
    bounds = [b for b in hist.bounds_s if math.isfinite(b)]
    if any(abs(b - objective_s) <= ON_A_BOUND * objective_s for b in bounds):
        return True
    below = max((b for b in bounds if b < objective_s), default=0.0)
    above = min((b for b in bounds if b > objective_s), default=math.inf)
    return below > 0 and above / below <= NARROW_BUCKET


def _pick(own, kernel, objective_s: float) -> tuple:
    """(histogram, source): the service's own where it resolves the objective or the
    kernel has none, else the kernel's."""
    if own is not None and (kernel is None or resolves(own, objective_s)):
        return own, "service"
    return (kernel, "ebpf") if kernel is not None else (None, "")


def _family(histograms: dict, name: str):
    """Every series of one histogram family merged (its labels summed away), or None."""
    return merged(h for (fam, _), h in histograms.items() if fam == name)



def kernel_timing(histograms: dict):
    """HTTP/1's request timing, else a Redis server's commands but the blocking ones
    (BLPOP, SUBSCRIBE: their time is whoever pushes or publishes), merged; or None."""
    if EBPF_LATENCY in histograms:
        return histograms[EBPF_LATENCY]
    return merged(h for (fam, label), h in histograms.items()
                  if fam == signals.REDIS_COMMAND and label != signals.REDIS_BLOCKING)


def _served(hist, refused):
    """A kernel HTTP histogram without the refusals (429, 503), which http_refused times
    again: the same values in the same buckets, so taking them out is exact. A refusal is
    one short answer, so its first body byte is its last write and TTFT loses them alike
    (Histogram.minus keeps the whole when a bucket would go negative)."""
    return hist if hist is None or refused is None else hist.minus(refused)


def _ebpf_served(histograms: dict, counters: dict, refused):
    """(latency, "ebpf", errors, rejected) from the kernel's HTTP signals: a 429 or 503 is
    a refusal, as a service's own outcome="rejected" is, so it leaves the latency (a fast
    "go away" would pull P99 down as the service sheds load) and the 5xx errors."""
    refused_5xx = histograms.get(EBPF_REFUSED_5XX)
    errors = counters.get(EBPF_ERRORS, 0.0) - (refused_5xx.count if refused_5xx is not None else 0)
    return (_served(histograms[EBPF_LATENCY], refused), "ebpf", max(errors, 0.0),
            float(refused.count) if refused is not None else 0.0)


def build(spec: ServiceSpec, start: float, end: float, samples: list[Sample]) -> Window:
    """Merge one service's samples for one interval into a Window."""
    latency_metric = spec.latency_metric
    histograms: dict[Key, Histogram | BucketHistogram] = {}
    counters: dict[Key, float] = {}
    gauges: dict[Key, float] = {}
    for s in samples:
        for key, h in s.histograms.items():
            add_into(histograms, key, h)
        for key, v in s.counters.items():
            counters[key] = counters.get(key, 0.0) + v
        gauges.update(s.gauges)
    histograms, counters = routes.judged(spec.routes, histograms, counters)   # its routes' alone, where it has some
    latency, source, errors, rejected = None, "", 0.0, 0.0
    refused = _family(histograms, EBPF_REFUSED)
    if latency_metric:
        by_outcome = [(labels.value(label, "outcome"), h) for (fam, label), h in histograms.items()
                      if fam == latency_metric]
        latency = merged(h for outcome, h in by_outcome if outcome not in REJECTED_OUTCOMES)
        source = "service" if latency is not None else ""
        errors = sum(h.count for outcome, h in by_outcome if outcome in ERROR_OUTCOMES)
        rejected = sum(h.count for outcome, h in by_outcome if outcome in REJECTED_OUTCOMES)
    if EBPF_LATENCY in histograms and (latency is None or not resolves(latency, spec.slo_p99_s)):
        latency, source, errors, rejected = _ebpf_served(histograms, counters, refused)
    elif latency is None and (commands := kernel_timing(histograms)) is not None:
        latency, source, errors = commands, "ebpf", counters.get(REDIS_ERRORS, 0.0)
    ttft, ttft_source = _pick(_family(histograms, spec.ttft_metric) if spec.ttft_metric else None,
                              _served(histograms.get(EBPF_TTFT), refused), spec.slo_ttft_p99_s)
    tpot, tpot_source = _pick(_family(histograms, spec.tpot_metric) if spec.tpot_metric else None,
                              histograms.get(EBPF_TPOT), spec.slo_tpot_p99_s)
    return Window(spec.name, start, end, spec.slo_p99_s, latency=latency, latency_source=source, errors=errors,
                  rejected=rejected, histograms=histograms, counters=counters, gauges=gauges,
                  slo_ttft_s=spec.slo_ttft_p99_s, slo_tpot_s=spec.slo_tpot_p99_s, ttft=ttft, tpot=tpot,
                  ttft_source=ttft_source, tpot_source=tpot_source)


def merged_latency(windows: list[Window]) -> Histogram | BucketHistogram | None:
    """The latency of several windows together. A service's latency can come from
    its own histogram in one window and from eBPF in another (a missed scrape);
    only windows with the most recent source are merged, as the two do not add."""
    source = next((w.latency_source for w in reversed(windows) if w.latency is not None), None)
    return merged(w.latency for w in windows if w.latency is not None and w.latency_source == source)


def merged_tokens(windows: list[Window], which: str) -> Histogram | BucketHistogram | None:
    """The windows' "ttft" or "tpot" histograms together, or None. Like the latency, they
    come from the service's own histogram in one window and from the kernel in another (a
    missed scrape): only those of the latest one's kind are merged, as the two do not add."""
    found = [h for w in windows if (h := getattr(w, which)) is not None]
    return merged(h for h in found if type(h) is type(found[-1]))
