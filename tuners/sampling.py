"""Sampling tuner: the trace sample rate that holds a traces/s budget.

Settings it changes: "trace_sample_rate" (head-sampling probability, 0..1) and, for
slotune, "trace_keep_slower_than_s": a tail rule under which the tracer keeps every
error trace and every trace slower than this many seconds (0 = rule off), on top of
the sampled ones."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from slotune.tuners.base import Decision, Option, Policy, Spec, changed, clamp, setting

if TYPE_CHECKING:
    from slotune.control.observations import Inputs

INTERVAL_S = 1.0
SPEC = Spec(("trace_sample_rate", "trace_keep_slower_than_s"),
            options=(Option("budget_traces_per_s", 10.0, 0.001, 1e6, "traces/s to keep"),))


@dataclass(frozen=True)
class Observation:
    now: float
    request_rps: float
    error_rps: float
    p90_s: float
    p99_s: float
    kept_rps: float            # traces the tracer kept in the window, per second
    budget_traces_per_s: float


@dataclass(frozen=True)
class RateState:
    rate: float
    kept: float = 0.0    # jaeger: traces kept since the last calculation
    seconds: float = 0.0


def _init(settings):
    return RateState(clamp(setting(settings, "trace_sample_rate", "sampling"), 0.0, 1.0))


def _set(state: RateState, rate: float, why: str, **extra):
    return replace(state, rate=rate, **extra), Decision(changed(state.rate, rate, "trace_sample_rate"), why)


# --- whitepaper 4.4: rate = min(1, 0.7*latency factor + 0.3*error factor), every second
def whitepaper_rate(p90_ms: float, error_rate: float) -> float:
    latency_factor = max(0.1, min(1.0, 1.0 - (p90_ms - 50) / 1500))
    error_factor = min(1.0, 0.3 + error_rate * 10)
    return min(1.0, latency_factor * 0.7 + error_factor * 0.3)


def _wp_decide(state: RateState, obs: Observation):
    err = obs.error_rps / obs.request_rps if obs.request_rps > 0 else 0.0
    rate = whitepaper_rate(obs.p90_s * 1e3, err)
    return _set(state, rate, f"P90 {obs.p90_s * 1e3:.0f} ms, errors {err:.2%}")


# --- Jaeger adaptive sampling (defaults: recalculated every 60 s, delta tolerance 0.3,
# increases capped at +50 %, probability floor 1e-5); the target is the budget
JAEGER_PERIOD_S = 60.0


def _jaeger_decide(state: RateState, obs: Observation):
    kept, seconds = state.kept + obs.kept_rps * INTERVAL_S, state.seconds + INTERVAL_S
    if seconds < JAEGER_PERIOD_S:
        return replace(state, kept=kept, seconds=seconds), Decision({}, "accumulating")
    actual, target = kept / seconds, obs.budget_traces_per_s
    if actual > 0 and abs(actual - target) / target <= 0.3:
        return _set(state, state.rate, f"{actual:.1f}/s within 30 % of {target:.1f}/s", kept=0.0, seconds=0.0)
    rate = state.rate * target / actual if actual > 0 else state.rate * 1.5
    rate = clamp(min(rate, state.rate * 1.5), 1e-5, 1.0)
    return _set(state, rate, f"kept {actual:.1f}/s vs target {target:.1f}/s", kept=0.0, seconds=0.0)


# --- slotune: keep every error and every trace above the last window's P99 (tail rule),
# spend the rest of the budget on a uniform sample, trimmed by the measured kept rate
@dataclass(frozen=True)
class BudgetState:
    rate: float
    keep_slower: float = 0.0
    trim: float = 1.0   # corrects the feed-forward estimate from what was really kept


TAIL_MARGIN = 0.85  # keep a little below the last P99: the next window's P99 moves
TAIL_SHARE = 0.015  # share of requests above TAIL_MARGIN * P99 (lognormal tails)


def _slotune_init(settings):
    return BudgetState(clamp(setting(settings, "trace_sample_rate", "sampling"), 0.0, 1.0),
                       max(0.0, float(settings.get("trace_keep_slower_than_s", 0.0))))


def _slotune_decide(state: BudgetState, obs: Observation):
    budget = obs.budget_traces_per_s
    trim = state.trim
    if state.keep_slower > 0 and obs.kept_rps > 0 and obs.request_rps > 0:
        trim = clamp(trim * (budget / obs.kept_rps) ** 0.2, 0.5, 2.0)
    tail = obs.error_rps + TAIL_SHARE * obs.request_rps  # errors + the slowest
    rest = obs.request_rps - tail
    rate = clamp(trim * (budget - tail) / rest, 0.0, 1.0) if rest > 0 else 1.0
    keep = TAIL_MARGIN * obs.p99_s if obs.p99_s > 0 else state.keep_slower
    changes = changed(state.rate, rate, "trace_sample_rate") | changed(state.keep_slower, keep, "trace_keep_slower_than_s")
    why = f"{obs.request_rps:.0f} req/s, {tail:.1f}/s kept by the tail rule, {rate:.2%} of the rest"
    return BudgetState(rate, keep, trim), Decision(changes, why)



# The state's field that holds each setting (Policy.resync writes the value in force there).
RATE_FIELDS = {"trace_sample_rate": "rate"}
BUDGET_FIELDS = {"trace_sample_rate": "rate", "trace_keep_slower_than_s": "keep_slower"}

POLICIES = {
    "slotune": Policy("slotune", "keep errors and > P99, sample the rest to fill the traces/s budget",
                      _slotune_init, _slotune_decide, fields=BUDGET_FIELDS),
    "whitepaper": Policy("whitepaper", "0.7*latency factor + 0.3*error factor, every second", _init, _wp_decide, fields=RATE_FIELDS),
    "jaeger": Policy("jaeger", "Jaeger adaptive: x target/actual every 60 s, +50 % cap, 30 % tolerance",
                     _init, _jaeger_decide, fields=RATE_FIELDS),
}


def observe(i: Inputs) -> Observation:
    hist = i.span.latency
    return Observation(
        now=i.now, request_rps=i.rate(lambda w: w.requests), error_rps=i.rate(lambda w: w.errors),
        p90_s=i.quantile(hist, 0.9), p99_s=i.quantile(hist, 0.99),
        kept_rps=i.family_sum("_traces_total", sampled="true") / i.seconds,
        budget_traces_per_s=i.options["budget_traces_per_s"])
