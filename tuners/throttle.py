"""Throttle tuner: a concurrency limit (and for the whitepaper rule, a rate limit)
that keeps a service's P99 latency under its SLO while carrying as much load as it can.
A service that declares a TTFT objective is steered on its time to first token
instead: a request admitted late waits before its first token, and a stream's length
is the user's, not a queue's.

Settings it changes: "concurrency_limit" (requests in flight; slotune, Gradient2,
Vegas, Envoy) and "rate_limit_rps" (the whitepaper's token-bucket AIMD).
The anchors keep their published constants but read one aggregated latency per
window (the window P50 stands for Netflix's and Envoy's per-request RTT sample)."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from slotune.tuners import degrade
from slotune.tuners.base import P99_AIM, Decision, Policy, Spec, changed, clamp, setting

if TYPE_CHECKING:
    from slotune.control.observations import Inputs

INTERVAL_S = 1.0
SPEC = Spec(("concurrency_limit",), {"whitepaper": ("rate_limit_rps",)})
LIMIT_BOUNDS = (1.0, 10_000.0)
RATE_BOUNDS = (0.1, 1_000_000.0)


@dataclass(frozen=True)
class Observation:
    now: float            # end of the window, seconds
    slo_s: float          # the service's P99 latency objective
    p50_s: float          # latency of requests completed in the window (0 when none)
    p90_s: float
    p99_s: float
    arrival_rps: float    # requests offered to the service (admitted + rejected)
    completed_rps: float
    goodput_rps: float    # completed within the SLO
    rejected_rps: float   # refused by the limiter
    in_flight: float      # peak requests in flight during the window
    queue_p99_s: float | None = None  # P99 of the time admitted requests waited in the service's
    #                                   queue; None when unmeasured (slotune then treats all of P99 as queue)
    degrade_room: bool = False  # a dimmer beside it can still degrade more answers (its ratio is under 1)
    wait_ahead_s: float = 0.0   # on TTFT: the requests waiting now over those completed a second (Little's
    #                             law), the wait a first token is yet to show; 0 where the service reports none
    engine: tuple[float, float] | None = None   # on TTFT: requests (running, waiting) inside the service,
    #                                             means over the interval; None where it reports neither


def _idle(obs: Observation) -> bool:
    return obs.completed_rps <= 0 or obs.p50_s <= 0


# --- whitepaper: adaptiveThrottle(), rate x0.9 when P99 > SLO else x1.1, every second
@dataclass(frozen=True)
class RateState:
    rate: float


def _wp_init(settings):
    return RateState(clamp(setting(settings, "rate_limit_rps", "throttle"), *RATE_BOUNDS))


def _wp_decide(state: RateState, obs: Observation):
    factor = 0.9 if obs.p99_s > obs.slo_s else 1.1
    rate = clamp(state.rate * factor, *RATE_BOUNDS)
    why = f"P99 {obs.p99_s * 1e3:.0f} ms {'>' if factor < 1 else '<='} SLO {obs.slo_s * 1e3:.0f} ms: rate x{factor}"
    return RateState(rate), Decision(changed(state.rate, rate, "rate_limit_rps"), why)


# --- the whitepaper's rule on a concurrency limit, for a proxy whose knob is its connections
# (HAProxy's server maxconn): limit x0.9 when P99 > SLO else x1.1, every second
@dataclass(frozen=True)
class AimdState:
    limit: float


def _aimd_init(settings):
    return AimdState(_limit_init(settings))


def _aimd_decide(state: AimdState, obs: Observation):
    if _idle(obs):
        return state, Decision({}, "no completed requests")
    over = obs.p99_s > obs.slo_s
    limit = clamp(state.limit * 0.9 if over else max(state.limit * 1.1, state.limit + 1), *LIMIT_BOUNDS)
    why = f"P99 {obs.p99_s * 1e3:.0f} ms {'>' if over else '<='} SLO {obs.slo_s * 1e3:.0f} ms: limit x{0.9 if over else 1.1}"
    return AimdState(limit), Decision(changed(state.limit, limit, "concurrency_limit"), why)


# --- Netflix concurrency-limits Gradient2Limit (defaults: smoothing 0.2, rttTolerance 1.5,
# longWindow 600 with a 10-sample warm-up, queueSize 4; app-limited when inflight < limit/2)
@dataclass(frozen=True)
class Gradient2State:
    limit: float
    long_rtt: float = 0.0
    samples: int = 0


def _limit_init(settings):
    return clamp(setting(settings, "concurrency_limit", "throttle"), *LIMIT_BOUNDS)


def _g2_init(settings):
    return Gradient2State(_limit_init(settings))


def _exp_avg(value: float, count: int, sample: float, window: int = 600, warmup: int = 10) -> float:
    """Netflix ExpAvgMeasurement: plain mean during warm-up, then an EMA with 2/(window+1)."""
    if count < warmup:
        return (value * count + sample) / (count + 1)
    factor = 2.0 / (window + 1)
    return value * (1 - factor) + sample * factor


def _g2_decide(state: Gradient2State, obs: Observation):
    if _idle(obs):
        return state, Decision({}, "no completed requests")
    short_rtt = obs.p50_s
    long_rtt = _exp_avg(state.long_rtt, state.samples, short_rtt)
    if long_rtt / short_rtt > 2:
        long_rtt *= 0.95
    nxt = Gradient2State(state.limit, long_rtt, state.samples + 1)
    if obs.in_flight < state.limit / 2:
        return nxt, Decision({}, "app-limited: in flight < limit/2")
    gradient = clamp(1.5 * long_rtt / short_rtt, 0.5, 1.0)
    new = state.limit * gradient + 4
    new = state.limit * 0.8 + new * 0.2
    new = clamp(new, *LIMIT_BOUNDS)
    return replace(nxt, limit=new), Decision(changed(state.limit, new, "concurrency_limit"),
                                             f"gradient {gradient:.2f} (long {long_rtt * 1e3:.1f} ms / short {short_rtt * 1e3:.1f} ms)")


# --- Netflix VegasLimit (defaults: alpha 3*log10(limit), beta 6*log10, threshold log10,
# +-log10(limit) steps, log10 of an int floored and at least 1, smoothing 1.0, probe every 30*limit samples)
@dataclass(frozen=True)
class VegasState:
    limit: float
    rtt_noload: float = 0.0
    probe_count: int = 0


def _log10(limit: float) -> int:
    return max(1, int(math.log10(max(1, int(limit)))))


def _vegas_init(settings):
    return VegasState(_limit_init(settings))


def _vegas_decide(state: VegasState, obs: Observation):
    if _idle(obs):
        return state, Decision({}, "no completed requests")
    rtt = obs.p50_s
    if state.probe_count + 1 > 30 * state.limit:
        return VegasState(state.limit, rtt, 0), Decision({}, "probe: reset rtt_noload")
    if state.rtt_noload == 0 or rtt < state.rtt_noload:
        return VegasState(state.limit, rtt, state.probe_count + 1), Decision({}, "new rtt_noload")
    nxt = VegasState(state.limit, state.rtt_noload, state.probe_count + 1)
    if obs.in_flight * 2 < state.limit:
        return nxt, Decision({}, "app-limited")
    queue = math.ceil(state.limit * (1 - state.rtt_noload / rtt))
    log = _log10(state.limit)
    if queue <= log:
        new = state.limit + 6 * log
    elif queue < 3 * log:
        new = state.limit + log
    elif queue > 6 * log:
        new = state.limit - log
    else:
        return nxt, Decision({}, f"queue {queue} within alpha..beta")
    new = clamp(new, *LIMIT_BOUNDS)
    return replace(nxt, limit=new), Decision(changed(state.limit, new, "concurrency_limit"), f"estimated queue {queue}")


# --- Envoy adaptive concurrency gradient controller (defaults: sample P50, buffer 25 %,
# min RTT recomputed every 60 s at min_concurrency 3 over 50 requests; gradient clamped
# 0.5..2, headroom sqrt(limit), max 1000). Runs at the tuner's 1 s cadence, not 100 ms.
@dataclass(frozen=True)
class EnvoyState:
    limit: float
    min_rtt: float = 0.0
    next_min_rtt_at: float = 0.0
    measuring: bool = False
    saved_limit: float = 0.0
    measured: int = 0


def _envoy_init(settings):
    return EnvoyState(_limit_init(settings))


def _envoy_decide(state: EnvoyState, obs: Observation):
    if not state.measuring and obs.now >= state.next_min_rtt_at:
        nxt = replace(state, measuring=True, saved_limit=state.limit, limit=3.0, measured=-1)
        return nxt, Decision(changed(state.limit, 3.0, "concurrency_limit"), "min RTT window: pin to 3")
    if state.measuring:  # the first window after the pin only drains the queue built before it
        count = 0 if state.measured < 0 else state.measured + int(round(obs.completed_rps * INTERVAL_S))
        if count < 50 or _idle(obs):
            return replace(state, measured=count), Decision({}, f"min RTT window: {count}/50 requests")
        nxt = replace(state, measuring=False, min_rtt=obs.p50_s, limit=state.saved_limit,
                      next_min_rtt_at=obs.now + 60.0)
        return nxt, Decision(changed(3.0, state.saved_limit, "concurrency_limit"),
                             f"min RTT {obs.p50_s * 1e3:.1f} ms, limit restored")
    if _idle(obs):
        return state, Decision({}, "no completed requests")
    gradient = clamp(state.min_rtt * 1.25 / obs.p50_s, 0.5, 2.0)
    limit = state.limit * gradient
    new = clamp(limit + math.sqrt(limit), 1.0, 1000.0)
    return replace(state, limit=new), Decision(changed(state.limit, new, "concurrency_limit"), f"gradient {gradient:.2f}")


# --- slotune: keep the queueing part of P99 inside what the SLO leaves after service time
@dataclass(frozen=True)
class SlotuneState:
    limit: float
    ceiling: float = LIMIT_BOUNDS[1]   # the limit in force when tuning began: the operator's, given back when load drops
    cut_p99: float = 0.0               # P99 of the window that began the current run of cuts; 0 once in budget
    cuts: int = 0                      # cuts in that run, none of which lowered P99 below cut_p99
    cut_to: float = 0.0                # the limit the last cut set
    just_cut: bool = False             # the last decision cut: its window still held the queue from before
    last_p99: float = 0.0              # P99 of the window the last decision read


def _slotune_init(settings):
    limit = _limit_init(settings)
    return SlotuneState(limit, ceiling=limit)


MISREAD_CUTS = 2  # cuts in a row that left P99 where it was: the wait was not queueing at this limit
DRAINING = 0.9    # P99 this far under the last window's since a cut: the queue drains at the limit in force
ENGINE_QUEUE_HELD = 0.25   # waiting over running inside the service from which its batch counts as full


def _slotune_decide(state: SlotuneState, obs: Observation):
    if _idle(obs):
        return state, Decision({}, "no completed requests")
    queue = obs.p99_s if obs.queue_p99_s is None else obs.queue_p99_s
    service_tail = max(0.0, obs.p99_s - queue)
    queue = max(queue, obs.wait_ahead_s)       # a queue building now, before its first tokens show it
    budget = max(P99_AIM * obs.slo_s - service_tail, 0.25 * service_tail)  # queue wait the SLO allows
    slack = 0.1 * budget
    if state.cuts and abs(state.limit - state.cut_to) > max(1.0, 0.1 * state.cut_to):
        # that cut is not in force (rolled back, held): it proved nothing
        state = replace(state, cut_p99=0.0, cuts=0, just_cut=False)
    run = (state.cut_p99, state.cuts, state.cut_to)   # a hold keeps the run of cuts as it is
    over = f"queue P99 {queue * 1e3:.0f} ms over its {budget * 1e3:.0f} ms budget"
    if queue > budget and obs.in_flight < 0.5 * state.limit:
        new, why = state.limit, (f"{over}, but {obs.in_flight:.0f} in flight is under half the limit: "
                                 f"it is not this limit they wait behind")
    elif queue > budget and obs.degrade_room and obs.p99_s <= obs.slo_s:
        # Degrade first, refuse only when degrading everything is not enough: the dimmer
        # answers the same windows and reaches 1 within a few of them when it cannot hold P99.
        new, why = state.limit, f"{over}: the dimmer can still degrade, it goes first"
    elif queue > budget and state.just_cut:
        # The window after a cut is mostly answers admitted before it, which waited behind the
        # old limit: its queue says nothing of the new one. A second cut on it halves a limit
        # that already holds (TCP cuts its window once a round trip, for the same reason).
        new, why = state.limit, f"{over}, but the cut to {state.limit:.0f} shows from the next window: held one"
    elif queue > budget and state.cuts and obs.p99_s <= DRAINING * state.last_p99:
        # The queue the old limit let build drains at the new one, over as many windows as
        # it is deep: cutting again while it falls halves a limit that holds (a real stack at
        # 1.5x: 32 -> 16 -> 8 where 16 was the best static limit, the second cut on 408 ms
        # two windows after 447 ms).
        new, why = state.limit, (f"{over}, but falling ({state.last_p99 * 1e3:.0f} -> {obs.p99_s * 1e3:.0f} ms) "
                                 f"since the cut to {state.cut_to:.0f}: its queue drains, held")
    elif queue > budget and state.cuts >= MISREAD_CUTS and obs.p99_s >= state.cut_p99:
        # A slower host (others' CPU, a slow dependency) reads as queueing too; cuts that did
        # not lower P99 show it was not: hold until P99 falls, not cut down to a few in flight.
        new, why = state.limit, (f"{state.cuts} cuts did not lower P99 ({state.cut_p99 * 1e3:.0f} -> "
                                 f"{obs.p99_s * 1e3:.0f} ms): its wait is not at this limit, held")
    elif queue > budget:
        factor = clamp((budget + slack) / (queue + slack), 0.5, 0.95)
        new = clamp(state.limit * factor, *LIMIT_BOUNDS)
        if (held := _a_batch_waiting(obs)) is not None and held < new:    # as deep as one batch waiting
            new = max(held, 0.25 * state.limit)
            factor = new / state.limit
        fell = obs.p99_s < state.cut_p99
        run = (obs.p99_s, 1, new) if fell or not state.cuts else (state.cut_p99, state.cuts + 1, new)
        why = f"{over}: x{factor:.2f}"
    else:
        run = (0.0, 0, state.cut_to)                   # back in budget: the run of cuts is over
        new, why = _loosen(state, obs, queue, budget, slack)
    new = clamp(new, *LIMIT_BOUNDS)
    cut_p99, cuts, cut_to = run
    return (replace(state, limit=new, cut_p99=cut_p99, cuts=cuts, cut_to=cut_to, just_cut=new < state.limit,
                    last_p99=obs.p99_s),
            Decision(changed(state.limit, new, "concurrency_limit"), why))


def _a_batch_waiting(obs: Observation) -> float | None:
    """The limit that keeps one batch running and one waiting inside an engine that says how
    many of each it has, or None. More waiting buys no throughput: it is wait (a real vLLM,
    4 running, at 2x its capacity: x0.5 cuts and x0.9 steps took 13 s from 64 to 8, where one
    batch waiting held). Counted from what runs, not from the limit: just after a cut the
    engine still holds what the old limit let in."""
    if obs.engine is None or obs.engine[0] <= 0:
        return None
    return max(1.0, 2.0 * obs.engine[0])


def _loosen(state: SlotuneState, obs: Observation, queue: float, budget: float, slack: float) -> tuple[float, str]:
    """The limit with its queue wait within budget: grown while it binds, given back toward
    where it started while it neither binds nor queues, else kept."""
    within = f"queue P99 {queue * 1e3:.0f} ms within {budget * 1e3:.0f} ms"
    binding = obs.rejected_rps > 0 or obs.in_flight >= 0.9 * state.limit
    if binding and obs.engine is not None and obs.engine[1] >= ENGINE_QUEUE_HELD * obs.engine[0] > 0:
        # An engine that keeps a queue of its own runs at its capacity: a higher limit adds its
        # queue's wait, not throughput; a queue over a batch deep is wait to give back, once
        # the window shows the limit in force (not the one after a cut).
        running, waiting = obs.engine
        if waiting > running and (held := _a_batch_waiting(obs)) is not None and held < state.limit \
                and not state.just_cut:
            return (max(held, 0.5 * state.limit),
                    f"limit binding, {within}, but {waiting:.0f} wait inside the service behind {running:.0f} "
                    f"running: wait without throughput, down to a batch waiting")
        return state.limit, f"limit binding, {within}, and its batch full with a queue behind it: kept"
    if binding:
        factor = clamp((budget + slack) / (queue + slack), 1.0, 1.1)
        return state.limit * factor, f"limit binding, {within}: x{factor:.2f}"
    if queue <= 0.5 * budget and state.limit < state.ceiling:
        return (min(state.ceiling, max(state.limit * 1.1, state.limit + 1)),   # +1: an integer limit of 2 grows too
                f"limit not binding, queue P99 {queue * 1e3:.0f} ms under half its {budget * 1e3:.0f} ms budget: "
                f"back toward the {state.ceiling:.0f} it started from")
    return state.limit, "limit not binding"


# The state's field that holds each setting (Policy.resync writes the value in force there).
LIMIT_FIELDS = {"concurrency_limit": "limit"}
RATE_FIELDS = {"rate_limit_rps": "rate"}


def _refuse_no_limit(name: str, value: float | None) -> None:
    if value is not None and value <= 0:
        raise ValueError(f"throttle tuner: {name} is {value:g} in force, which the service reads as no limit "
                         f"(the reference gateway and HAProxy do), and a limit steered by factors cannot start "
                         f"from it: give the service a starting {name} (what it would run with without slotune) "
                         "and reload slotune (SIGHUP)")


def _needs_a_limit(policy: Policy) -> Policy:
    """The policy, refusing to start from or go on steering a limit of 0 in force: clamped
    up, it read as a limit of 1 that binds, and the first push set the bound's minimum on a
    service that had no limit (2 concurrent queries on the reference gateway). The loop stops
    the tuner with this reason in the audit log; a reload starts it again."""
    name, = policy.fields

    def initial_state(settings):
        _refuse_no_limit(name, setting(settings, name, "throttle"))
        return policy.initial_state(settings)

    def decide(state, obs):
        _refuse_no_limit(name, policy.held(state, name))    # resync wrote the value in force there
        return policy.decide(state, obs)
    return replace(policy, initial_state=initial_state, decide=decide)


POLICIES = {name: _needs_a_limit(policy) for name, policy in {
    "slotune": Policy("slotune", "concurrency limit steered by queue-wait P99 vs the SLO left after service time",
                      _slotune_init, _slotune_decide, fields=LIMIT_FIELDS),
    "whitepaper": Policy("whitepaper", "rate x0.9 if P99 > SLO else x1.1, every second", _wp_init, _wp_decide, fields=RATE_FIELDS),
    "aimd": Policy("aimd", "limit x0.9 if P99 > SLO else x1.1 (+1 at least), every second", _aimd_init,
                   _aimd_decide, fields=LIMIT_FIELDS),
    "gradient2": Policy("gradient2", "Netflix Gradient2Limit, published defaults", _g2_init, _g2_decide, fields=LIMIT_FIELDS),
    "vegas": Policy("vegas", "Netflix VegasLimit, published defaults", _vegas_init, _vegas_decide, fields=LIMIT_FIELDS),
    "envoy": Policy("envoy", "Envoy adaptive concurrency gradient controller, published defaults",
                    _envoy_init, _envoy_decide, fields=LIMIT_FIELDS),
}.items()}


def _at_proxy(i: Inputs, on_ttft: bool):
    """The proxy's TTFT or latency over the interval, where it timed requests; else None."""
    if i.admission_span is None:
        return None
    hist = i.admission_span.ttft if on_ttft else i.admission_span.latency
    return hist if hist is not None and hist.count else None


def _wait_ahead(i: Inputs, completed_rps: float) -> float:
    """The wait of the requests waiting at the interval's end, by Little's law: a TTFT read
    from first tokens shows a queue only once its requests get theirs, a second or more after
    it began to build (a real vLLM stepped to 2x its capacity: first cut 3.7 s into the step)."""
    waiting = i.gauge_last("_num_requests_waiting")
    return sum(waiting) / completed_rps if waiting and completed_rps > 0 else 0.0


def _engine(i: Inputs) -> tuple[float, float] | None:
    """Requests running and waiting inside the service, means over the interval."""
    running = i.gauge_mean("_num_requests_running")
    if running <= 0 or not any(fam.endswith("_num_requests_waiting") for w in i.recent for fam, _ in w.gauges):
        return None
    return running, i.gauge_mean("_num_requests_waiting")


def observe(i: Inputs) -> Observation:
    """The interval's latency (its TTFT, where the service declares a TTFT objective), rates
    and queue wait; in flight as the service says, else by Little's law; and whether a dimmer
    beside it can still degrade (it goes first). On TTFT no queue wait is read apart: the
    first token is queue and prefill, and an engine's own queue histogram is coarse there
    (vLLM's starts at 0.3 s), so all of its P99 counts as queue. A service throttled at a
    proxy (admission_by) is steered on the proxy's clock where the proxy's requests are
    timed: an engine's API server that falls behind leaves requests unread in its socket,
    and neither the engine's histograms nor the kernel's clock at its read see that wait
    (a real vLLM at 2x its capacity on 2 cores, 2026-12-07: client TTFT P99 7.9 s, vLLM's
    own and the kernel's at vLLM under 0.9 s; at HAProxy the kernel's clock starts first)."""
    spec = i.conf.spec
    on_ttft = spec.slo_ttft_p99_s > 0
    hist = _at_proxy(i, on_ttft)
    if hist is None:
        hist = i.span.ttft if on_ttft else i.span.latency
    completed = i.rate(lambda w: w.requests)
    in_flight = i.gauge_max("_inflight_requests")
    if in_flight is None:  # Little's law when the service does not say
        whole = i.span.latency
        in_flight = completed * (whole.mean() if whole is not None and whole.count else 0.0)
    return Observation(
        now=i.now, slo_s=spec.slo_ttft_p99_s if on_ttft else spec.slo_p99_s, p50_s=i.quantile(hist, 0.5),
        p90_s=i.quantile(hist, 0.9), p99_s=i.quantile(hist, 0.99), arrival_rps=i.rate(lambda w: w.requests + w.rejected),
        completed_rps=completed, goodput_rps=i.rate(lambda w: w.goodput * w.seconds),
        rejected_rps=i.rate(lambda w: w.rejected), in_flight=float(in_flight),
        queue_p99_s=None if on_ttft else i.queue_p99(), degrade_room=degrade.room(i),
        wait_ahead_s=_wait_ahead(i, completed) if on_ttft else 0.0, engine=_engine(i) if on_ttft else None)
