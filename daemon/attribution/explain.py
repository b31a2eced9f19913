"""Which measured cause explains a service's tail and jitter, from its recent
windows, recursively along the services it calls.

Method (judged by how much each cause moved against the service's own
baseline, so a clean service has no dominant cause however large its usual
tail is):

- recent span: the last `recent_s` seconds of windows, merged; baseline: the
  earlier windows of the horizon cut into spans as long (a P99 of 30 requests
  must be compared with P99s of 30 requests, not of 3000), leaving out
  disturbed spans (P99 above the median by more than 3 robust deviations);
  the baseline's P50, P99 and cause readings are medians over its spans.
- the request timing is the kernel's (eBPF HTTP, fine buckets) where it has
  one, else the service's own histogram. growth = how far the recent span moved
  over the baseline: its P99 (the tail grew), or its P50 when every request
  slowed (a per-request cost moves the P50 as far, and the P50 of a few dozen
  requests is far steadier), whichever stands further beyond its noise band
  (2 robust deviations of the spans' values plus 5 % of the baseline). Only
  growth beyond the noise band is attributed, unless the service's own
  per-request costs measured by the kernel account for it (see _moves).
  excess = P99(recent) - P50(baseline), the whole tail, is reported beside it.
- every cause is read as seconds a tail request gains from it
  (daemon/attribution/causes.py); a downstream service as its own P99 or P50,
  whichever moved here; a cause is credited with its rise beyond its own usual
  band (median + 2 robust deviations over the baseline spans; for a downstream
  service, its growth beyond its noise band). The growth is split in
  proportion to those rises; where the rises add up to less than the growth
  they are scaled up at most TAIL_GAIN times (a stall of the event loop
  delays every request queued behind it, so the tail gains several times the
  mean), and whatever is left stays unexplained. Tool calls the service times
  itself first lose what its own stalls explain (a blocked loop reads replies late).
- more load is a cause of its own ("offered_load"): when requests come faster
  than the baseline's usual rate, the service's queueing rise and the growth no
  other measured cost explains are credited to it (see _offered_load).
- so is falling behind ("queueing"): when the service answers fewer requests than
  arrive, the growth the measured causes leave even scaled up is its queue's; the
  queue is credited to the run-queue wait and blocking that rose where the service
  answers fewer than it usually does (they slowed it), else to "queueing" (it answers
  as many as ever and more arrive: an overload). See _falling_behind.
- shares = credited seconds / growth: what made the tail move. What was
  there all along (the usual tail) is nobody's share. A downstream service's share is split
  again by its own explanation, so the answer names a path.
- jitter (spread of per-window P99 over the horizon) is split by non-negative
  regression of per-window P99 on per-window cause readings (scipy nnls);
  each cause gets beta * cov(cause, P99) / var(P99).
- a service that declares a TTFT or TPOT objective has its TTFT and TPOT
  explained the same way, each from its own distribution (Window.ttft, .tpot)
  with the causes that move it (causes.TOKEN_CAUSES: waiting sequences, prefill
  per step, batch width, preemptions, GPU, run-queue wait, network) and without
  callees or the offered-load fold: more load shows there as waiting sequences,
  and the verdict says which signal moved ("71 % queue (waiting 14 → 52)").
"""
from __future__ import annotations

import math
import operator
from bisect import bisect_right
from dataclasses import dataclass, field, replace
from itertools import compress
from typing import Mapping, Sequence

import numpy as np
from scipy.optimize import nnls

from slotune.attribution import causes
from slotune.model import signals
from slotune.attribution.spans import (TOKENS, Stats, baseline_spans, ended, jitter_rows, stats,
                                      timed, timed_column, timing_source)
from slotune.model.columns import column
from slotune.model.window import Window


DOMINANT_SHARE = 0.2     # a cause above this share of the growth is named
TAIL_GAIN = 10.0         # most the tail may exceed the sum of the causes' mean rises: behind a
                         # stall the P99 wait of a queue at 60 % load is ~4.6 S/(1-rho) = 11.5 S
NOISE_SIGMAS = 2.0
NOISE_FLOOR_RATIO = 0.05  # growth under 5 % of the baseline P99 is noise
NOISE_FLOOR_S = 0.0005
CORROBORATION = 0.5      # rises covering this much of a growth halve the band it must clear
MIN_BASELINE_SPANS = 5
RECENT_S = 2.0           # the span judged: two collection windows at the default 1 s
HORIZON_S = 300.0        # look-back: a fault stays named until it fills half of it
BASELINE_SPANS = 60      # the calm spans the baseline is summarised from, latest first
LOAD_RISE = 0.2          # requests coming this much above the baseline's usual rate are more load
QUEUES = ("batch_queue_wait",)   # the queueing more load explains
FALLING_BEHIND = 0.05    # a service leaving more than this share of its arrivals waiting falls behind
FALLING_BEHIND_RPS = 1.0  # if more than this many a second (one read in a span, answered in the next, is no queue)
QUEUEING = "queueing"    # falling behind as a cause, where no stall made the service answer fewer


@dataclass(frozen=True)
class Evidence:
    """What backs a cause: the signal read, in users' words and its unit, its value over
    the baseline spans (median) and recently, the rise in seconds it explains, and the
    seconds of the growth credited to it once the causes are weighed."""
    signal: str
    unit: str
    baseline: float
    recent: float
    rise_s: float
    short: str = ""                   # the signal in one word, for the verdict; "" = not shown
    credited_s: float | None = None   # None until credited
    note: str = ""                    # what the verdict says of it instead ("45 arriving/s, 40 answered/s")

    def as_status(self) -> dict:
        out = {"signal": self.signal, "unit": self.unit, "baseline": self.baseline, "recent": self.recent,
               "rise_s": self.rise_s}
        return out | ({"short": self.short} if self.short else {}) | ({"note": self.note} if self.note else {}) | \
            ({"credited_s": self.credited_s} if self.credited_s is not None else {})


@dataclass
class Explanation:
    service: str
    verdict: str
    top_cause: str = ""                                  # "" = no dominant cause
    shares: dict[str, float] = field(default_factory=dict)        # cause -> share of the growth
    confidence: float = 0.0
    excess_s: float = 0.0                                # P99 recent - P50 baseline
    moved: str = "P99"                                   # "P99", or "P50" when every request slowed
    usual_tail_s: float = 0.0                            # P99 - P50 of the baseline
    moves: dict[str, tuple[float, float, float]] = field(default_factory=dict)  # "P99"/"P50" -> (growth, band, attributable)
    p50_s: float = math.nan
    p99_s: float = math.nan
    jitter_s: float = 0.0                                # std of per-window P99 over the horizon
    jitter_shares: dict[str, float] = field(default_factory=dict)
    evidence: dict[str, Evidence] = field(default_factory=dict)   # cause -> what backs it
    downstream: dict[str, "Explanation"] = field(default_factory=dict)
    path: list[tuple[str, str, float]] = field(default_factory=list)  # (service, cause, share) to the root cause
    also: list[list[tuple[str, str, float]]] = field(default_factory=list)  # the paths of other dominant causes
    what: str = ""                                       # "" (request latency), "TTFT" or "TPOT"
    tokens: dict[str, "Explanation"] = field(default_factory=dict)   # "ttft"/"tpot" -> its explanation

    @property
    def growth_s(self) -> float:
        """How far what moved (P99 or P50) rose over the baseline: what the shares split."""
        return self.moves[self.moved][0] if self.moves else 0.0

    @property
    def noise_s(self) -> float:
        """The band a growth had to clear to count."""
        return self.moves[self.moved][1] if self.moves else 0.0

    @property
    def root_cause(self) -> tuple[str, str, float]:
        """(service, cause, share of this service's growth) at the end of the path, or ("", "", 0)."""
        if not self.path:
            return "", "", 0.0
        share = 1.0
        for _, _, s in self.path:
            share *= s
        return self.path[-1][0], self.path[-1][1], share

    def as_status(self) -> dict:
        return {"verdict": self.verdict, "top_cause": self.top_cause, "shares": self.shares,
                "confidence": self.confidence, "evidence": {c: e.as_status() for c, e in self.evidence.items()},
                "path": [list(p) for p in self.path], "also": [[list(p) for p in path] for path in self.also],
                "excess_s": self.excess_s, "growth_s": self.growth_s,
                "usual_tail_s": self.usual_tail_s,
                "moved": self.moved,
                "jitter_s": self.jitter_s, "jitter_shares": self.jitter_shares,
                **({"p99_s": _finite(self.p99_s)} if self.what else {}),
                **({"tokens": {k: e.as_status() for k, e in self.tokens.items()}} if self.tokens else {})}


def _finite(v: float) -> float | None:
    return v if math.isfinite(v) else None


@dataclass
class _Split:
    """A service's windows cut into a recent span and a baseline of spans as long."""
    recent: Stats
    baseline: list[Stats]       # calm spans of recent_s each, oldest first
    windows: list[Window]        # the horizon, with requests, oldest first
    source: str                  # the request timing read (timing_source)
    p50: float                   # baseline medians over its spans
    p99: float
    sigma_s: float               # robust spread of the spans' P99
    p50_sigma_s: float           # and of their P50


def _split(windows: Sequence[Window], now: float, recent_s: float, horizon_s: float,
           source: str = "") -> _Split | None:
    """Quantiles of a few windows are compared with quantiles of as many windows
    (a P99 of 30 requests sits below the P99 of 3000), so the baseline is a set
    of spans as long as the recent one, summarised by medians over the spans whose
    P50 and P99 are both usual (an earlier fault, or its aftermath, is left out).
    source: "ttft" or "tpot" to split those, else the request timing's."""
    horizon = _ending_in(windows, now - horizon_s, now)
    source = source or timing_source(horizon)
    live = list(compress(horizon, timed_column(horizon, source)))
    cut = bisect_right(live, now - recent_s, key=operator.attrgetter("end"))
    recent, older = live[cut:], live[:cut]
    spans = baseline_spans(older, source, recent_s)
    if not recent or len(spans) < MIN_BASELINE_SPANS:
        return None
    p50, p99 = np.array([s.p50 for s in spans]), np.array([s.p99 for s in spans])

    def usual(v: np.ndarray) -> np.ndarray:
        return v <= _median(v) + 3 * _robust_sd(v) + NOISE_FLOOR_S
    calm = [s for s, ok in zip(spans, usual(p50) & usual(p99)) if ok][-BASELINE_SPANS:]
    calm_p50, calm_p99 = np.array([s.p50 for s in calm]), np.array([s.p99 for s in calm])
    return _Split(stats(recent, source), calm, live, source, _median(calm_p50),
                  _median(calm_p99), _robust_sd(calm_p99), _robust_sd(calm_p50))


def _ending_in(windows: Sequence[Window], after: float, until: float) -> Sequence[Window]:
    """The windows (oldest first) that ended in (after, until], found by bisection."""
    end = operator.attrgetter("end")
    return windows[bisect_right(windows, after, key=end):bisect_right(windows, until, key=end)]


def _median(values) -> float:
    """np.median of a short sequence, without its any-axis machinery (a pass over the
    horizon takes hundreds): the same value, NaN when one is NaN."""
    v = np.sort(np.asarray(values, dtype=float))
    n = len(v)
    if not n or np.isnan(v[-1]):
        return math.nan
    return float(v[n // 2]) if n % 2 else float((v[n // 2 - 1] + v[n // 2]) / 2)


def _robust_sd(values: np.ndarray) -> float:
    return 1.4826 * _median(np.abs(values - _median(values)))


def _rises(split: _Split, skip_tools: set[str]) -> dict[str, Evidence]:
    """The service's own causes -> evidence: the baseline (median over its spans) and
    recent readings, and the rise (s)."""
    now = split.recent.readings
    known = set(now).union(*(s.readings for s in split.baseline)) - skip_tools
    out = {}
    for cause in known:
        base = [s.readings.get(cause) for s in split.baseline]
        ref = now.get(cause) or next(r for r in base if r is not None)
        values = np.array([r.value_s if r else 0.0 for r in base])
        median = _median(values)
        usual = median + NOISE_SIGMAS * _robust_sd(values)
        r = now.get(cause)
        out[cause] = Evidence(ref.signal, ref.unit, baseline=_median([r.raw if r else 0.0 for r in base]),
                              recent=r.raw if r else 0.0, rise_s=max((r.value_s if r else 0.0) - usual, 0.0),
                              short=ref.short)
    return out


def _downstream_rises(downstream: Mapping[str, "Explanation"], moved: str) -> dict[str, Evidence]:
    """Each callee read by the same quantile that moved here: a P50 shift is made of the
    callees' P50 shifts, a P99 growth of their P99 growth; each beyond its noise band."""
    out = {}
    for name, exp in downstream.items():
        growth, _, attributable = exp.moves[moved]
        recent = exp.p99_s if moved == "P99" else exp.p50_s
        out[f"downstream:{name}"] = Evidence(f"{name} {moved}", "s", baseline=recent - growth, recent=recent,
                                             rise_s=attributable)
    return out


def _offered_load(split: _Split, evidence: dict[str, Evidence], attributable: float) -> dict[str, Evidence]:
    """More load as a cause of its own, the commonest cause of a tail: requests arriving
    per second (spans._arrivals: read, as the kernel saw them; else answered and
    refused) beyond the baseline spans' usual rate (median + 2 robust deviations) and
    LOAD_RISE above their median. The service's queueing rise
    is then the load's doing (requests queued because more came, not because a setting
    held them), and so is the growth no other measured cost explains (a server that
    times a request from its first read does not see it wait in the socket backlog).
    Returns the evidence with the queue causes folded into "offered_load"."""
    rates = np.array([s.offered_rps for s in split.baseline])
    base, now = _median(rates), split.recent.offered_rps
    if not base or now <= max(base * (1 + LOAD_RISE), base + NOISE_SIGMAS * _robust_sd(rates)):
        return evidence
    evidence = dict(evidence)
    queued = sum(evidence.pop(c).rise_s for c in QUEUES if c in evidence)
    others = sum(e.rise_s for e in evidence.values())
    evidence["offered_load"] = Evidence("requests arriving per second", "1/s", baseline=base, recent=now,
                                        rise_s=max(queued, attributable - others, 0.0))
    return evidence


STALLS = ("runqueue_wait", "blocking_syscalls")   # they stretch everything the service times itself
PER_REQUEST = (*STALLS, "connect", "tls_handshake", "network_rtt", "retransmits")   # the kernel's own costs


def _falling_behind(split: _Split, evidence: dict[str, Evidence],
                    attributable: float) -> tuple[dict[str, Evidence], dict[str, float]]:
    """A service that answers fewer requests than arrive falls behind: its queue grows and
    each request waits behind more. It does when the recent span left waiting (spans._queued:
    arrivals beyond answers, or the in-flight gauge's rise) more than FALLING_BEHIND of its
    arrivals, FALLING_BEHIND_RPS and 2 robust deviations of the baseline spans' own. The
    growth the measured causes leave even scaled up TAIL_GAIN times is then the queue's:
    the run-queue wait and blocking that rose take it (in proportion to their rises) where
    the service answers FALLING_BEHIND fewer a second than the baseline spans' median (they
    slowed it: the queue is their doing); else QUEUEING does (it answers as many as ever and
    more arrive: an overload, or a slowdown nothing measured). Returns the evidence, and the
    seconds of the growth each of those causes takes as the queue's (see _credit)."""
    now, base = split.recent, split.baseline
    arriving = now.answered_rps + now.queued_rps
    left = attributable - TAIL_GAIN * sum(e.rise_s for e in evidence.values())
    queued = np.array([s.queued_rps for s in base])
    if left <= 0 or now.queued_rps <= max(FALLING_BEHIND * arriving, FALLING_BEHIND_RPS,
                                         NOISE_SIGMAS * _robust_sd(queued)):
        return evidence, {}
    note = f"{_rounded(arriving)} arriving/s, {_rounded(now.answered_rps)} answered/s" + (
        f", {now.in_flight:.0f} in flight" if now.in_flight is not None else "")
    stalls = {c: evidence[c].rise_s for c in STALLS if c in evidence and evidence[c].rise_s > 0}
    if stalls and now.answered_rps < (1 - FALLING_BEHIND) * _median([s.answered_rps for s in base]):
        total = sum(stalls.values())
        return evidence | {c: replace(evidence[c], note=note) for c in stalls}, \
            {c: left * rise / total for c, rise in stalls.items()}
    queue = Evidence("requests arriving per second beyond those answered", "1/s", baseline=_median(queued),
                     recent=now.queued_rps, rise_s=left, note=note)
    return evidence | {QUEUEING: queue}, {QUEUEING: left}


def _discount_own_clock(evidence: dict[str, Evidence]) -> dict[str, Evidence]:
    """Tool calls timed by the caller include the caller's own stalls (a blocked event
    loop answers the tool's reply late): take the stalls' tail off them first."""
    stall = TAIL_GAIN * sum(evidence[c].rise_s for c in STALLS if c in evidence)
    if stall <= 0:
        return evidence
    return {cause: replace(e, rise_s=max(e.rise_s - stall, 0.0)) if cause.startswith("tool:") else e
            for cause, e in evidence.items()}


def _moves(split: _Split, own_rise: float) -> dict[str, tuple[float, float, float]]:
    """How far the recent span moved over the baseline, as (growth, noise band, the
    growth to attribute): the tail ("P99") and the whole distribution ("P50"). A cost
    every request pays (a handshake, a stall per request) moves the P50 as far as the
    P99, and the P50 of a few dozen requests is far steadier than their P99. The band is
    2 robust deviations of the baseline spans' values plus 5 % of the baseline value;
    only growth beyond it is attributed. A growth that the service's own per-request
    costs, as the kernel measured them, account for at least half of is corroborated:
    it needs to clear only half the band, and then all of it is attributed, as those
    costs were measured request by request, not read from a noisy quantile (a callee's
    or a tool's growth does not corroborate: it is a latency read as noisily as this one)."""
    def judged(growth: float, sigma: float, base: float) -> tuple[float, float, float]:
        band = NOISE_SIGMAS * sigma + NOISE_FLOOR_RATIO * base + NOISE_FLOOR_S
        if growth > 0 and own_rise >= CORROBORATION * growth:
            return growth, band / 2, growth if growth > band / 2 else 0.0
        return growth, band, max(growth - band, 0.0)
    return {"P99": judged(split.recent.p99 - split.p99, split.sigma_s, split.p99),
            "P50": judged(split.recent.p50 - split.p50, split.p50_sigma_s, split.p50)}


def _credit(growth: float, rises: dict[str, float], queued: dict[str, float]) -> dict[str, float]:
    """The growth split in proportion to the rises, scaled up at most TAIL_GAIN times; the
    seconds queued (_falling_behind: what the scaled rises leave) are added as they are."""
    total = sum(rises.values())
    rest = growth - sum(queued.values())
    scale = min(rest / total, TAIL_GAIN) if rest > 0 and total > 0 else 0.0
    credit = {c: r * scale for c, r in rises.items()}
    return credit | {c: credit.get(c, 0.0) + s for c, s in queued.items()}


def _jitter(split: _Split, downstream_windows: Mapping[str, Sequence[Window]]) -> tuple[float, dict[str, float]]:
    ws = split.windows
    rows = jitter_rows(ws, split.source)
    y = np.array(rows.p99)
    if len(ws) < 3 or not np.all(np.isfinite(y)) or y.std() == 0:
        return (float(y.std()) if len(ws) and np.all(np.isfinite(y)) else 0.0), {}
    columns = rows.in_order()
    for name, dws in downstream_windows.items():
        near = _ending_in(dws, ws[0].end - 0.001, ws[-1].end + 0.001)   # all that round to ws' ends
        by_end = dict(ended for ended in column(near, "ended column", ended) if ended[1] is not None)
        columns[f"downstream:{name}"] = [by_end.get(end, math.nan) for end, _ in column(ws, "ended column", ended)]
    table = np.array(list(columns.values()), dtype=float).reshape(len(columns), len(ws))   # a row per cause
    varies = np.isfinite(table).all(axis=1)
    varies[varies] = table[varies].std(axis=1) > 0
    names = list(compress(columns, varies))
    if not names:
        return float(y.std()), {}
    x = table[varies].T
    xc, yc = x - x.mean(axis=0), y - y.mean()
    beta, _ = nnls(xc, yc)
    var = float(yc @ yc)
    shares = {c: max(float(b * (xc[:, i] @ yc) / var), 0.0) for i, (c, b) in enumerate(zip(names, beta))}
    return float(y.std()), {c: s for c, s in shares.items() if s > 0}


def call_graph(services) -> dict[str, tuple[str, ...]]:
    """Who calls whom, from the config: each service's `downstream` list plus the
    peers (remote port -> name) of its TCP connections that are services too."""
    names = {s.name for s in services}
    return {s.name: tuple(dict.fromkeys([*s.downstream, *(p for p in s.spec.peers.values()
                                                          if p in names and p != s.name)]))
            for s in services}


def explain(service: str, history: Mapping[str, Sequence[Window]],
            downstream: Mapping[str, Sequence[str]] | None = None, *, now: float | None = None,
            recent_s: float = RECENT_S, horizon_s: float = HORIZON_S,
            untimeable: Mapping[str, str] | None = None) -> Explanation:
    """Explain `service`'s tail from history[service] (windows, oldest first),
    following downstream[service] (names of services it calls) recursively;
    untimeable: service -> why its requests can never be timed (attribution/timeable.py)."""
    return _Explainer(history, downstream or {}, now, recent_s, horizon_s, untimeable or {}).explain(service,
                                                                                                   frozenset())


def explain_all(history: Mapping[str, Sequence[Window]], downstream: Mapping[str, Sequence[str]] | None = None, *,
                now: float | None = None, recent_s: float = RECENT_S, horizon_s: float = HORIZON_S,
                untimeable: Mapping[str, str] | None = None,
                guard=lambda service, explain: explain()) -> dict[str, Explanation]:
    """Every service in history explained once (the daemon calls this each window);
    guard(service, explain) runs each one's explain() (the daemon's bulkhead: None where it
    failed, and that service has no explanation this time)."""
    ex = _Explainer(history, downstream or {}, now, recent_s, horizon_s, untimeable or {})
    out = {name: guard(name, lambda name=name: ex.explain(name, frozenset())) for name in history}
    return {name: e for name, e in out.items() if e is not None}


class _Explainer:
    """One pass over the services at one instant; each service is explained once."""

    def __init__(self, history, downstream, now, recent_s, horizon_s, untimeable):
        self.history, self.downstream, self.untimeable = history, downstream, untimeable
        self.now = now if now is not None else max((ws[-1].end for ws in history.values() if ws), default=0.0)
        self.recent_s, self.horizon_s = recent_s, horizon_s
        self.done: dict[str, Explanation] = {}

    def explain(self, service: str, seen: frozenset) -> Explanation:
        if service not in self.done:
            self.done[service] = self._explain(service, seen | {service})
        return self.done[service]

    def _explain(self, service: str, seen: frozenset) -> Explanation:
        windows = list(self.history.get(service, ()))
        split = _split(windows, self.now, self.recent_s, self.horizon_s)
        if split is None:
            exp = self._warming(service, "", windows)
        else:
            callees = [d for d in self.downstream.get(service, ()) if d not in seen and d in self.history]
            below = {d: self.explain(d, seen) for d in callees}
            below = {d: e for d, e in below.items() if math.isfinite(e.p99_s)}
            exp = self._attribute(service, "", split, below)
        declared = {"ttft": windows[-1].slo_ttft_s, "tpot": windows[-1].slo_tpot_s} if windows else {}
        for which, objective in declared.items():
            if objective > 0:
                token_split = _split(windows, self.now, self.recent_s, self.horizon_s, which)
                exp.tokens[which] = (self._attribute(service, TOKENS[which], token_split, {}) if token_split
                                     else self._warming(service, TOKENS[which], windows))
        return exp

    def _warming(self, service: str, what: str, windows: list[Window]) -> Explanation:
        """No explanation yet: too few windows with requests, or none lately (a server whose
        running batch admits nobody gives no first token however many wait), or none ever
        (a service whose requests the config says cannot be timed, as long as none is)."""
        name = f"{service}{' ' + what if what else ''}"
        answered = [w for w in _ending_in(windows, self.now - self.horizon_s, math.inf)
                    if (timed(w, what.lower()) if what else w.requests)]
        if not what and not answered and service in self.untimeable:
            return Explanation(service, f"{name}: cannot be timed: {self.untimeable[service]}")
        talking = [w for w in windows if any(sig == signals.TCP_RTT and h.count for (sig, _), h in w.histograms.items())]
        if not what and not answered and len(talking) > MIN_BASELINE_SPANS:
            return Explanation(service, f"{name}: {len(talking)} windows with TCP traffic but no request timed: its "
                                        f"protocol is none slotune's families time (HTTP/1, Redis), and its own "
                                        f"metrics give no latency", what=what)
        if answered and answered[-1].end <= self.now - self.recent_s and len(answered) > MIN_BASELINE_SPANS:
            queued = causes.waiting(windows[-1])
            return Explanation(service, f"{name}: no request timed in the last {self.recent_s:g} s"
                                        + (f" ({queued:.0f} waiting)" if queued else ""), what=what)
        return Explanation(service, f"{name}: warming up: {len(answered)} window(s) with requests, needs "
                                    f"{MIN_BASELINE_SPANS} spans of {self.recent_s:g} s before the last one", what=what)

    def _attribute(self, service: str, what: str, split: _Split, below: dict[str, Explanation]) -> Explanation:
        """Shares of what moved (request latency, or what = TTFT / TPOT) among the causes' rises."""
        evidence = _rises(split, {f"tool:{d}" for d in below})
        moves = _moves(split, sum(evidence[c].rise_s for c in PER_REQUEST if c in evidence))
        moved = max(moves, key=lambda m: moves[m][0] - moves[m][1])   # further beyond its band
        growth, noise, attributable = moves[moved]
        evidence = _discount_own_clock(evidence | _downstream_rises(below, moved))
        queued: dict[str, float] = {}
        if not what:
            evidence, queued = _falling_behind(split, _offered_load(split, evidence, attributable), attributable)

        p50_base, p99_base = split.p50, split.p99
        p99 = split.recent.p99
        excess = max(p99 - p50_base, 0.0)
        rises = {c: e.rise_s for c, e in evidence.items() if c != QUEUEING}
        credit = _credit(attributable, rises, queued)
        evidence = {c: replace(e, credited_s=credit[c]) if c in credit else e for c, e in evidence.items()}
        shares = {c: (s / growth if growth > 0 else 0.0) for c, s in credit.items()}
        jitter_s, jitter_shares = _jitter(split, {d: self.history[d] for d in below})
        exp = Explanation(service, "", shares=shares, excess_s=excess,
                          usual_tail_s=max(p99_base - p50_base, 0.0), moved=moved, moves=moves,
                          p50_s=split.recent.p50, p99_s=p99, jitter_s=jitter_s, jitter_shares=jitter_shares,
                          evidence=evidence, downstream=below, what=what)
        _conclude(exp, attributable, noise, sum(rises.values()) + sum(queued.values()))
        return exp


def _conclude(exp: Explanation, attributable: float, noise: float, total_rise: float) -> None:
    """Top cause, path, confidence and the verdict line."""
    ranked = sorted(exp.shares.items(), key=lambda kv: -kv[1])
    top, top_share = ranked[0] if ranked else ("", 0.0)
    second = ranked[1][1] if len(ranked) > 1 else 0.0
    head = f"{exp.service} {exp.what + ' ' if exp.what else ''}{exp.moved} {exp.growth_s * 1e3:+.1f} ms over its baseline"
    if top_share <= DOMINANT_SHARE:
        exp.verdict = f"{head}: no dominant cause"
        exp.confidence = 1.0 - top_share / DOMINANT_SHARE
        return
    exp.top_cause = top
    exp.path = _path(exp, top, top_share)
    exp.also = [_path(exp, cause, share) for cause, share in ranked[1:] if share > DOMINANT_SHARE]
    significance = min(attributable / max(noise, 1e-9), 1.0)
    dominance = (top_share - second) / top_share
    coverage = min(total_rise / attributable, 1.0) if attributable > 0 else 0.0
    exp.confidence = significance * (0.5 + 0.5 * dominance) * (0.5 + 0.5 * coverage)
    exp.verdict = f"{head}: " + "; ".join(" → ".join(f"{s * 100:.0f} % {c.removeprefix('downstream:')}"
                                                   for _, c, s in path) + _moved_signal(exp, path)
                                          for path in (exp.path, *exp.also))


def _moved_signal(exp: Explanation, path: list[tuple[str, str, float]]) -> str:
    """' (waiting 14 → 52)': the signal that moved, for a cause that names one in a word,
    or what its note says (' (45 arriving/s, 40 answered/s)')."""
    service, cause, _ = path[-1]
    e = exp.evidence.get(cause) if service == exp.service else None
    if e is None or not (e.short or e.note):
        return ""
    return f" ({e.note})" if e.note else f" ({e.short} {_rounded(e.baseline)} → {_rounded(e.recent)})"


def _rounded(v: float) -> str:
    return f"{v:.0f}" if abs(v) >= 10 else f"{v:.2g}"


def _path(exp: Explanation, cause: str, share: float) -> list[tuple[str, str, float]]:
    """(service, cause, share) from this service down to where the cause lives."""
    path = [(exp.service, cause, share)]
    if cause.startswith("downstream:"):
        path += exp.downstream[cause.split(":", 1)[1]].path
    return path
