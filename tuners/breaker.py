"""Breaker tuner: how a tool's circuit breaker decides to open and when it probes again.

Settings it changes: "breaker_failure_threshold" (failure ratio over the breaker's
sliding window that opens it; above 1 = never on the ratio), "breaker_consecutive_failures"
(open after this many failures in a row; 0 = off) and "breaker_open_s" (seconds open
before half-open probe calls)."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from slotune.tuners.base import Decision, Option, Policy, Spec, setting

if TYPE_CHECKING:
    from slotune.control.observations import Inputs

INTERVAL_S = 1.0
NAMES = ("breaker_failure_threshold", "breaker_consecutive_failures", "breaker_open_s")
SPEC = Spec(NAMES, options=(Option("slo_failure_rate", 0.003, 0.0, 1.0, "a tool's failure-rate objective"),))


@dataclass(frozen=True)
class Observation:
    now: float
    calls: int            # calls sent to the tool in the window (probes included)
    failures: int
    breaker_open: bool    # the breaker's state at the end of the window
    slo_failure_rate: float = 0.003


@dataclass(frozen=True)
class BreakerState:
    threshold: float
    consecutive: float
    open_s: float


def _init(settings):
    return BreakerState(*(setting(settings, name, "breaker") for name in NAMES))


def _push(old: BreakerState, new: BreakerState, why: str, state=None):
    changes = {name: b for name, a, b in zip(NAMES, (old.threshold, old.consecutive, old.open_s),
                                              (new.threshold, new.consecutive, new.open_s)) if a != b}
    return (state if state is not None else new), Decision(changes, why)


def _fixed(threshold: float, consecutive: float, open_s: float, why: str):
    def decide(state: BreakerState, obs: Observation):
        return _push(state, BreakerState(threshold, consecutive, open_s), why)
    return decide


# --- whitepaper 4.1: threshold = max(0.3 %, 0.8 x failure rate over 5 min), recomputed
# after three 30 s samples in a row above 0.25 %
@dataclass(frozen=True)
class WhitepaperState:
    breaker: BreakerState
    history: tuple[tuple[int, int], ...] = ()   # (calls, failures) of the last 300 s
    streak: int = 0                              # 30 s samples in a row above 0.25 %


def whitepaper_threshold(observed_rate: float, slo: float = 0.003) -> float:
    return max(slo, 0.8 * observed_rate)


def _wp_init(settings):
    return WhitepaperState(_init(settings))


def _wp_decide(state: WhitepaperState, obs: Observation):
    history = (state.history + ((obs.calls, obs.failures),))[-300:]
    if int(obs.now) % 30:
        return replace(state, history=history), Decision({}, "between 30 s samples")
    last = history[-30:]
    calls, fails = sum(c for c, _ in last), sum(f for _, f in last)
    streak = state.streak + 1 if calls and fails / calls > 0.0025 else 0
    if streak < 3:
        return replace(state, history=history, streak=streak), Decision({}, f"{streak}/3 samples above 0.25 %")
    calls5, fails5 = sum(c for c, _ in history), sum(f for _, f in history)
    new = replace(state.breaker, threshold=whitepaper_threshold(fails5 / max(1, calls5), obs.slo_failure_rate))
    return _push(state.breaker, new, f"5 min failure rate {fails5 / max(1, calls5):.2%}",
                 WhitepaperState(new, history, 0))


# --- slotune: open on the ratio at 50 % (past that, a refused call costs less than a sent one),
# or on K failures in a row where K makes a healthy run of K failures a one-in-a-thousand-hours
# event given the Wilson upper bound of the tool's healthy failure rate; probe after 1 s,
# doubling while probes keep failing up to the period that balances failed probes against
# a recovered tool left unused (longest_open_s), back to 1 s once it closes.
@dataclass(frozen=True)
class SlotuneState:
    breaker: BreakerState
    healthy_calls: float = 0.0   # exponentially forgotten counts while closed
    healthy_failures: float = 0.0
    was_open: bool = False


def wilson_upper(failures: float, calls: float, z: float = 3.0) -> float:
    if calls <= 0:
        return 1.0
    p = failures / calls
    centre = p + z * z / (2 * calls)
    spread = z * math.sqrt(p * (1 - p) / calls + z * z / (4 * calls * calls))
    return min(1.0, (centre + spread) / (1 + z * z / calls))


def run_length(p_fail: float, calls_per_s: float, hours: float = 1000.0) -> int:
    """Smallest K with P(K failures in a row somewhere in `hours`) < 1 (healthy tool)."""
    starts = max(1.0, calls_per_s * 3600 * hours)
    return max(3, math.ceil(math.log(1.0 / starts) / math.log(max(p_fail, 1e-9))))


OUTAGE_S = 60.0  # the outage length the probe period is planned for


def longest_open_s(calls_per_s: float) -> float:
    """Probe period that balances failed probes (one per period while the tool is down) against
    calls refused after it recovers (half a period of traffic): sqrt(2 * outage / rate)."""
    return min(60.0, max(1.0, math.sqrt(2 * OUTAGE_S / max(calls_per_s, 1e-3))))


def _slotune_init(settings):
    return SlotuneState(_init(settings))


def _slotune_decide(state: SlotuneState, obs: Observation):
    calls, fails = state.healthy_calls, state.healthy_failures
    if not obs.breaker_open and not state.was_open:
        calls, fails = calls * 0.999 + obs.calls, fails * 0.999 + obs.failures
    rate = max(obs.calls / INTERVAL_S, calls * 0.001)  # calls/s: this window or the long-run mean
    k = run_length(wilson_upper(fails, calls), rate) if calls >= 100 else 8
    open_s = state.breaker.open_s
    if obs.breaker_open and state.was_open and obs.failures > 0:
        open_s = min(longest_open_s(rate), open_s * 2)   # a half-open probe failed: it opened again
    elif not obs.breaker_open or not state.was_open:
        open_s = 1.0                        # closed, or just opened: back to the base
    new = BreakerState(0.5, float(min(k, 50)), open_s)
    why = f"healthy failure rate <= {wilson_upper(fails, calls):.3%}: open after {new.consecutive:.0f} in a row or 50 %"
    return _push(state.breaker, new, why, SlotuneState(new, calls, fails, obs.breaker_open))



# The state's field that holds each setting (Policy.resync writes the value in force there).
OWN_FIELDS = dict(zip(NAMES, ("threshold", "consecutive", "open_s")))
NESTED_FIELDS = {name: "breaker." + path for name, path in OWN_FIELDS.items()}

POLICIES = {
    "slotune": Policy("slotune", "50 % or a statistically rare failure run; probe after 1 s, doubling to sqrt(2*60 s/rate)",
                      _slotune_init, _slotune_decide, fields=NESTED_FIELDS),
    "whitepaper": Policy("whitepaper", "max(0.3 %, 0.8 x 5 min failure rate) after 3 samples > 0.25 %",
                         _wp_init, _wp_decide, fields=NESTED_FIELDS),
    "pybreaker": Policy("pybreaker", "pybreaker defaults: 5 failures in a row, 60 s reset timeout",
                        _init, _fixed(2.0, 5.0, 60.0, "pybreaker: fail_max 5, reset_timeout 60 s"), fields=OWN_FIELDS),
    "resilience4j": Policy("resilience4j", "resilience4j defaults: 50 % failure rate, 60 s open",
                           _init, _fixed(0.5, 0.0, 60.0, "resilience4j: failureRateThreshold 50, wait 60 s"), fields=OWN_FIELDS),
}


def observe(i: Inputs) -> Observation:
    return Observation(now=i.now, calls=int(i.family_sum("_tool_calls_total")),
                       failures=int(i.family_sum("_tool_calls_total", outcome="error")),
                       breaker_open=any(v > 0 for v in i.gauge_last("_breaker_open")),
                       slo_failure_rate=i.options["slo_failure_rate"])
