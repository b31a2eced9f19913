"""Batch tuner: the dynamic batcher's max batch size and max queue delay under a P99 SLO.

Settings it changes: "max_batch_size" (requests per batch) and "max_queue_delay_ms"
(how long the oldest queued request may wait for the batch to fill).
The observation carries the batches run in the window: (size, count, mean compute s)."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from slotune.tuners.base import Decision, Policy, Spec, changed, clamp, setting

if TYPE_CHECKING:
    from slotune.control.observations import Inputs

INTERVAL_S = 5.0
SPEC = Spec(("max_batch_size", "max_queue_delay_ms"))
SIZE_BOUNDS = (1.0, 128.0)
DELAY_BOUNDS_MS = (0.0, 1000.0)


@dataclass(frozen=True)
class Observation:
    now: float
    slo_s: float                  # P99 end-to-end latency objective (queue + batch)
    p99_s: float                  # end-to-end P99 of requests completed in the window (0 when none)
    arrival_rps: float
    goodput_rps: float            # completed within the SLO
    batches: tuple[tuple[int, int, float], ...] = ()  # (batch size, batches run, mean compute seconds)


def _sizes(settings) -> tuple[float, float]:
    return (clamp(setting(settings, "max_batch_size", "batch"), *SIZE_BOUNDS),
            clamp(setting(settings, "max_queue_delay_ms", "batch"), *DELAY_BOUNDS_MS))


@dataclass(frozen=True)
class SizeState:
    size: float
    delay_ms: float
    last_change: float = -math.inf
    done: bool = False  # triton: search finished


def _size_init(settings):
    return SizeState(*_sizes(settings))


def _move(state: SizeState, size: float, why: str, now: float, **extra):
    size = clamp(float(int(size)), *SIZE_BOUNDS)
    return (replace(state, size=size, last_change=now, **extra),
            Decision(changed(state.size, size, "max_batch_size"), why))


# --- whitepaper 2.3: b = ((0.8*SLO - 8.3 ms) / (2.1 ms * 1.28))^2, clamp 1..128, every 30 s
def whitepaper_size(slo_ms: float) -> int:
    return max(1, min(128, int(((slo_ms * 0.8 - 8.3) / (2.1 * 1.28)) ** 2))) if slo_ms * 0.8 > 8.3 else 1


def _wp_decide(state: SizeState, obs: Observation):
    if obs.now - state.last_change < 30.0:
        return state, Decision({}, "whitepaper recomputes every 30 s")
    if obs.p99_s <= 0:
        return _move(state, 1, "no latency measured: b = 1", obs.now)
    return _move(state, whitepaper_size(obs.slo_s * 1e3), f"b = ((0.8*{obs.slo_s * 1e3:.0f} - 8.3)/2.69)^2", obs.now)


# --- Clipper AIMD: add to the batch size until a batch takes longer than the SLO, then x0.9
CLIPPER_STEP = 2


def _clipper_decide(state: SizeState, obs: Observation):
    if not obs.batches:
        return state, Decision({}, "no batches ran")
    slowest = max(mean for _, _, mean in obs.batches)
    if slowest > obs.slo_s:
        return _move(state, state.size * 0.9, f"batch took {slowest * 1e3:.0f} ms > SLO: x0.9", obs.now)
    return _move(state, state.size + CLIPPER_STEP, f"batch {slowest * 1e3:.0f} ms within SLO: +{CLIPPER_STEP}", obs.now)


# --- Triton's advice (model analyzer): double the batch size while P99 stays within the
# latency budget; on the first breach step back to the last good size and stay there
def _triton_decide(state: SizeState, obs: Observation):
    if state.done or obs.p99_s <= 0:
        return state, Decision({}, "search finished" if state.done else "no latency measured")
    if obs.p99_s > obs.slo_s:
        return _move(state, max(1.0, state.size / 2), "P99 over budget: back to the last good size", obs.now, done=True)
    return _move(state, state.size * 2, "P99 within budget: double", obs.now)


# --- slotune: fit batch time = a + c*b from the observed batches, then take the largest b
# whose worst case (wait for one running batch, then run its own) fits the SLO; while P99
# is over the SLO with most batches full (a backlog), grow by half each decision to drain
# it, then decay back. While P99 is over the SLO with batches not full (slow batches, as
# with heavy-tailed batch times, not a backlog), let a batch wait up to half its fixed cost
# a to fill: fewer, fuller batches spend less time on a, so a slow batch leaves a shorter
# queue behind it. The wait goes when P99 is back under 70 % of the SLO.
# The size bound assumes batch times are predictable. The fit also measures how widely
# they scatter (their CV, from how the per-size means of one window spread around it, so a
# slowdown common to the window cancels); when even two batches of size 1 would break the
# SLO at the P99 of a lognormal with that CV, no size keeps the worst case within the SLO,
# and the bound only slows the draining of the queue a slow batch leaves: the size goes to
# the top of its range, and one free instance takes that whole queue in one batch.
@dataclass(frozen=True)
class FitState:
    size: float
    delay_ms: float
    n: float = 0.0      # exponentially forgotten sums for the least-squares fit
    sb: float = 0.0
    st: float = 0.0
    sbb: float = 0.0
    sbt: float = 0.0
    spread: float = 0.0  # forgotten sum of count * (relative residual - window mean)^2 ...
    spread_df: float = 0.0  # ... and of its degrees of freedom (sizes seen per window - 1)


MARGIN = 1.0     # two back-to-back batches within the SLO (their worst case is rare)
FORGET = 0.7     # weight kept by older windows at each decision
FILL_WAIT = 0.5  # queue delay, as a share of the fixed batch cost a, while slow batches break the SLO
Z99 = 2.326      # standard normal 99th percentile


def _fit_init(settings):
    return FitState(*_sizes(settings))


def fit_latency(state: FitState) -> tuple[float, float] | None:
    """(a, c) of batch time = a + c*b, or None until two batch sizes were seen."""
    det = state.n * state.sbb - state.sb ** 2
    if state.n <= 0 or det <= 1e-12 * max(1.0, state.n * state.sbb):
        return None
    c = (state.n * state.sbt - state.sb * state.st) / det
    a = (state.st - c * state.sb) / state.n
    return max(a, 0.0), max(c, 1e-9)


def scatter(batches, a: float, c: float) -> tuple[float, float]:
    """(sum of count * (r - r_window)^2, degrees of freedom) for the relative residuals r of the
    window's per-size mean batch times around a + c*b: each mean of n batches has variance
    CV^2 / n, so the sum over the sizes has expectation (sizes - 1) * CV^2."""
    if len(batches) < 2:
        return 0.0, 0.0
    res = [(count, mean / (a + c * size) - 1) for size, count, mean in batches]
    n = sum(count for count, _ in res)
    centre = sum(count * r for count, r in res) / n
    return sum(count * (r - centre) ** 2 for count, r in res), len(res) - 1.0


def p99_factor(cv2: float) -> float:
    """P99 / mean of a lognormal whose squared coefficient of variation is cv2."""
    sigma2 = math.log1p(cv2)
    return math.exp(Z99 * math.sqrt(sigma2) - sigma2 / 2)


def _slotune_decide(state: FitState, obs: Observation):
    f = FORGET
    n, sb, st, sbb, sbt = (state.n * f, state.sb * f, state.st * f, state.sbb * f, state.sbt * f)
    for ran, count, mean in obs.batches:       # ran: that group's batch size
        n += count
        sb += count * ran
        st += count * mean
        sbb += count * ran * ran
        sbt += count * ran * mean
    nxt = replace(state, n=n, sb=sb, st=st, sbb=sbb, sbt=sbt)
    model = fit_latency(nxt)
    if model is None:  # explore: one bigger size teaches the slope
        return _move_fit(nxt, state.size * 2 if obs.batches else state.size, "learning the batch-time slope")
    a, c = model
    ss, df = scatter(obs.batches, a, c)
    nxt = replace(nxt, spread=state.spread * f + ss, spread_df=state.spread_df * f + df)
    cv2 = nxt.spread / nxt.spread_df if nxt.spread_df > 0 else 0.0
    fits = (MARGIN * obs.slo_s / 2 - a) / c
    why = f"batch time {a * 1e3:.1f} + {c * 1e3:.2f}*b ms: two batches fit the SLO up to b={fits:.0f}"
    if 2 * (a + c) * p99_factor(cv2) > MARGIN * obs.slo_s:
        fits = SIZE_BOUNDS[1]
        why = (f"batch time {a * 1e3:.1f} + {c * 1e3:.2f}*b ms, CV {math.sqrt(cv2):.2f}: at P99 no size keeps two "
               f"batches within the SLO, so no bound on b: a free instance drains a slow batch's queue at once")
    ran = sum(count for _, count, _ in obs.batches)
    full = sum(count for size, count, _ in obs.batches if size >= state.size)
    delay_ms = state.delay_ms
    if obs.p99_s > obs.slo_s and state.size >= int(fits) and full > ran / 2:  # a backlog: bigger batches drain it
        size, why = state.size * 1.5, why + f"; P99 {obs.p99_s * 1e3:.0f} ms over SLO: grow to drain the queue"
    elif obs.p99_s > 0.7 * obs.slo_s:
        size = max(fits, state.size)
        if obs.p99_s > obs.slo_s:  # slow batches, not a backlog: fill them to spend less on a
            delay_ms = FILL_WAIT * a * 1e3
            why += f"; P99 {obs.p99_s * 1e3:.0f} ms over SLO with batches not full: wait {delay_ms:.1f} ms to fill"
    else:
        size, delay_ms = max(fits, state.size * 0.8), 0.0
    return _move_fit(nxt, size, why, delay_ms)


def _move_fit(state: FitState, size: float, why: str, delay_ms: float = 0.0):
    size = clamp(float(int(size)), *SIZE_BOUNDS)
    changes = changed(state.size, size, "max_batch_size") | changed(state.delay_ms, delay_ms, "max_queue_delay_ms")
    return replace(state, size=size, delay_ms=delay_ms), Decision(changes, why)



# The state's field that holds each setting (Policy.resync writes the value in force there).
SIZES_FIELDS = {"max_batch_size": "size", "max_queue_delay_ms": "delay_ms"}

POLICIES = {
    "slotune": Policy("slotune", "fit a + c*b, largest b whose 2(a+cb) fits the SLO (none if batch times are too spread); wait a/2 to fill while slow batches miss it",
                      _fit_init, _slotune_decide, fields=SIZES_FIELDS),
    "whitepaper": Policy("whitepaper", "b = ((0.8*SLO - 8.3)/(2.1*1.28))^2, 1..128, every 30 s",
                         _size_init, _wp_decide, fields=SIZES_FIELDS),
    "clipper_aimd": Policy("clipper_aimd", "Clipper: +2 while batch time <= SLO, x0.9 after", _size_init, _clipper_decide, fields=SIZES_FIELDS),
    "triton": Policy("triton", "Triton advice: double b until P99 breaks the budget, keep the last good",
                     _size_init, _triton_decide, fields=SIZES_FIELDS),
}


def observe(i: Inputs) -> Observation:
    hist = i.span.latency
    return Observation(
        now=i.now, slo_s=i.conf.spec.slo_p99_s, p99_s=i.quantile(hist, 0.99),
        arrival_rps=i.rate(lambda w: w.requests + w.rejected), goodput_rps=i.rate(lambda w: w.goodput * w.seconds),
        batches=batches_run(i))


def batches_run(i: Inputs) -> tuple[tuple[int, int, float], ...]:
    """(mean batch size, batches, mean compute s) per window: the batch time is linear in
    the size, so a window's mean compute sits on the fit at its mean size, and windows
    of different sizes let the tuner see both the slope and the scatter around it."""
    out = []
    for w in i.recent:
        sizes, compute = i.family_hist("_batch_size", [w]), i.family_hist("_batch_compute_seconds", [w])
        if sizes is not None and compute is not None and sizes.count and compute.count:
            out.append((max(1, round(sizes.mean())), compute.count, compute.mean()))
    return tuple(out)
