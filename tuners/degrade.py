"""Degrade tuner: the share of queries a service answers degraded (cheaper: no tool
calls, fewer tokens) that holds its P99 under the SLO with the fewest degraded answers,
degrading before the throttle refuses where that pays: where a second degrading carries
more worth (a degraded answer worth `degraded_worth` of a full one) than full answers
alone carry when the service is busy (verdict(), from the service's own windows and two
trials of a few seconds: degrading the excess, then, where that could pay, everything).

Setting it changes: "degrade_ratio" (0..1; 1 = every answer degraded). Beside the
throttle, through the window only: slotune's dimmer acts on a share of the queue wait the
throttle allows, so the throttle tightens only once degrading everything cannot hold P99,
and refusals while the ratio is below 1 make it degrade more, until the throttle's limit
stops binding and the throttle loosens it.
Anchor "brownout", Klein et al., ICSE 2014 (Brownout: Building More Robust Cloud
Applications): theta (the share served in full) <- theta + (1 - p1) / alpha * (setpoint -
t), t the period's latency percentile, pole p1 = 0.9, alpha of the model t = alpha * theta
by recursive least squares (forgetting 0.95, P0 = 1000, alpha0 = 1). Adapted: t is the
window P99, the setpoint 0.75 x SLO (under the throttle's 0.8), alpha kept positive and P
at most P0 (at theta = 0 the estimator learns nothing and P would grow without bound)."""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from slotune.tuners.base import P99_AIM, Decision, Option, Policy, Spec, changed, clamp, setting

if TYPE_CHECKING:
    from slotune.control.observations import Inputs

INTERVAL_S = 1.0
SETTING = "degrade_ratio"
WORTH = 0.5                   # what a degraded answer is worth to its user, a full one being worth 1
SPEC = Spec((SETTING,), options=(Option("degraded_worth", WORTH, 0.0, 1.0,
                                        "what a degraded answer is worth, a full one being worth 1"),))
SHARE = 0.9                   # slotune's queue-wait budget: this share of the throttle's
SETPOINT = P99_AIM - 0.05    # brownout's P99 setpoint as a share of the SLO, under the throttle's aim
EVIDENCE_S = 300.0            # how far back the windows that say whether degrading pays reach
FULL_ONLY, DEGRADING = 0.05, 0.2   # a window's degraded share: at most this, full answers only; at least, degrading
ALL = 0.9                     # a window's degraded share from which it degraded (nearly) everything
OVER = 1.1                    # a window offered this many times what it carried was overloaded
FULL_WINDOWS = 2              # busy windows of full answers alone before K is known
SETTLING, TRIED = 1, 2        # windows of a trial: the first holds the queue from before it, then these say
LOAD_S = 5.0                  # the load offered, as the trials read it, is over this many seconds (a second's
#                               count of Poisson arrivals at 55/s swings from 36 to 68)


def queue_budget(slo_s: float, p99_s: float, queue_p99_s: float) -> float:
    """The queue wait slotune's dimmer allows: SHARE of the throttle's own budget (the SLO's
    target less the service's own tail)."""
    service_tail = max(0.0, p99_s - queue_p99_s)
    return SHARE * max(P99_AIM * slo_s - service_tail, 0.25 * service_tail)


@dataclass(frozen=True)
class Busy:
    """One window in which the service was busy throughout (its queue wait over the
    dimmer's budget): what it carried then is what it can carry at that mix."""
    completed_rps: float
    degraded_rps: float
    offered_rps: float = 0.0 # answered and refused
    refused: bool = False    # the limiter in front refused some: what it let through, not what the service could
    busy: bool = True        # its queue wait was over the dimmer's budget: it carried all it could


@dataclass(frozen=True)
class Verdict:
    """Whether degrading answers lets the service carry more worth a second than full
    answers alone, from its busy windows and two trials: degrading the excess over what full
    answers carry (`mixed`), and degrading everything (`whole`), each None until tried."""
    full_rps: float = math.nan       # full answers a second it carried busy, degrading nothing
    worth_rps: float = math.nan      # the most worth a second a trial carried
    why: str = "no busy window yet"
    mixed: bool | None = None        # degrading the excess carried more worth than full answers alone
    whole: bool | None = None        # degrading every answer did
    full_most_rps: float = math.nan  # the most full answers a second any busy window carried

    @property
    def pays(self) -> bool | None:
        """True once either trial paid, False once both did not, None until then."""
        if self.mixed or self.whole:
            return True
        return False if self.mixed is False and self.whole is False else None

    @property
    def full_known(self) -> bool:
        return math.isfinite(self.full_rps)

    def can_pay(self, offered_rps: float, worth: float) -> bool:
        """Degrading may still pay at this load: it was seen to, or a trial is left that could.
        Degrading everything carries at most `worth` x what is offered: within the most full
        answers alone were seen to carry busy (K, a median, falls while a throttle in front
        holds the service under what it can carry), nothing to try."""
        if self.pays is not None:
            return self.pays
        return self.mixed is None or worth * offered_rps > self.full_most_rps


def _trial_says(worths: list[float], full_rps: float) -> tuple[bool | None, float]:
    """A trial's answer, past its settling window, and the worth a second it carried."""
    if len(worths) < SETTLING + TRIED:
        return None, math.nan
    carried = float(np.median(worths[SETTLING:]))
    return carried > full_rps, carried


def verdict(busy: list[Busy], worth: float) -> Verdict:
    """Busy windows degrading (nearly) nothing give the full-answer capacity K, their
    median; windows degrading at least DEGRADING of their answers (and under ALL) give the
    worth carried degrading the excess, and windows degrading ALL or more the worth carried
    degrading everything (full + worth x degraded a second), each the median past the
    trial's settling window. A degraded answer that costs the service nearly a full one's
    work (a batch that runs as long as its longest answer, a degraded answer that still
    waits on the same model) carries less worth than refusing would leave: then it does
    not pay; in a batch it may pay only when the whole batch is degraded, hence the second
    trial."""
    full = [b.completed_rps for before, b in zip(busy, busy[1:])     # two in a row, offered a tenth more than
            if b.busy and before.busy and b.offered_rps >= OVER * b.completed_rps   # it carried: not a second's
            and b.degraded_rps <= FULL_ONLY * b.completed_rps]                      # bad luck at a lighter load
    if len(full) < FULL_WINDOWS:
        return Verdict(why=f"{len(full)} busy window(s) of full answers alone, {FULL_WINDOWS} needed")
    full_rps = float(np.median(full))
    carried = [(b.degraded_rps / b.completed_rps, b.completed_rps - (1 - worth) * b.degraded_rps) for b in busy
               if b.completed_rps > 0 and (b.busy or not b.refused)]
    mixed, mixed_rps = _trial_says([w for share, w in carried if DEGRADING <= share < ALL], full_rps)
    whole, whole_rps = _trial_says([w for share, w in carried if share >= ALL], full_rps)
    head = f"busy with full answers alone, {full_rps:.0f}/s"
    tried = [f"degrading the excess, {mixed_rps:.0f} worth/s"] * (mixed is not None) \
        + [f"degrading all, {whole_rps:.0f} worth/s"] * (whole is not None)
    worth_rps = max((w for w in (mixed_rps, whole_rps) if math.isfinite(w)), default=math.nan)
    return Verdict(full_rps, worth_rps, "; ".join([head, *tried]) if tried else f"{head}; no trial yet",
                   mixed, whole, max(full))


@dataclass(frozen=True)
class Observation:
    now: float             # end of the window, seconds
    slo_s: float           # the service's P99 latency objective
    p99_s: float           # latency of the answers completed in the window (0 when none)
    arrival_rps: float     # queries offered (answered + refused)
    completed_rps: float   # answered, in full or degraded
    degraded_rps: float    # answered degraded (by the dimmer, or because a tool failed)
    refused_rps: float     # refused by the service's limits (the throttle's)
    queue_p99_s: float | None = None  # P99 of the time answers waited for their turn; None: unmeasured
    #                                   (slotune then treats all of P99 as queue, as the throttle does)
    verdict: Verdict = field(default_factory=Verdict)   # whether degrading pays here (slotune's policy)
    worth: float = WORTH   # what a degraded answer is worth, a full one being worth 1
    load_rps: float = 0.0  # queries offered a second over the last LOAD_S (0: arrival_rps stands for it)


def _idle(obs: Observation) -> bool:
    return obs.completed_rps <= 0 or obs.p99_s <= 0


def _ratio(settings) -> float:
    ratio = setting(settings, SETTING, "degrade")
    if not 0 <= ratio <= 1:
        raise ValueError(f"degrade tuner: setting {SETTING} = {ratio} is outside 0..1")
    return ratio


# --- whitepaper (notes section 4.2): P99 over the threshold 3 periods in a row -> degrade
# fully; back to full answers at the first period under it
@dataclass(frozen=True)
class ThresholdState:
    ratio: float
    over: int = 0          # periods in a row with P99 over the SLO


def _wp_init(settings):
    return ThresholdState(_ratio(settings))


def _wp_decide(state: ThresholdState, obs: Observation):
    if _idle(obs):
        return state, Decision({}, "no completed requests")
    over = state.over + 1 if obs.p99_s > obs.slo_s else 0
    ratio = 1.0 if over >= 3 else 0.0 if over == 0 else state.ratio
    why = (f"P99 {obs.p99_s * 1e3:.0f} ms {'>' if over else '<='} SLO {obs.slo_s * 1e3:.0f} ms "
           f"({over} period{'s' if over != 1 else ''} in a row)")
    return ThresholdState(ratio, over), Decision(changed(state.ratio, ratio, SETTING), why)


# --- brownout (Klein et al. 2014): adaptive PI-like control of theta = 1 - ratio
@dataclass(frozen=True)
class BrownoutState:
    ratio: float
    alpha: float = 1.0     # estimated latency (s) per unit of theta
    p: float = 1000.0      # RLS covariance


POLE, FORGETTING, P0, ALPHA_FLOOR = 0.9, 0.95, 1000.0, 1e-4


def _bo_init(settings):
    return BrownoutState(_ratio(settings))


def _bo_decide(state: BrownoutState, obs: Observation):
    if _idle(obs):
        return state, Decision({}, "no completed requests")
    theta, t = 1.0 - state.ratio, obs.p99_s
    a = state.p * theta
    g = 1.0 / (theta * a + FORGETTING)
    alpha = max(ALPHA_FLOOR, state.alpha + g * a * (t - theta * state.alpha))
    p = min(P0, (state.p - g * a * a) / FORGETTING)
    error = SETPOINT * obs.slo_s - t
    ratio = 1.0 - clamp(theta + (1 - POLE) / alpha * error, 0.0, 1.0)
    why = f"P99 {t * 1e3:.0f} ms vs setpoint {SETPOINT * obs.slo_s * 1e3:.0f} ms, alpha {alpha:.3f} s"
    return BrownoutState(ratio, alpha, p), Decision(changed(state.ratio, ratio, SETTING), why)


# --- slotune: steer the rate of full answers the service carries; the ratio follows the
# offered load at once (1 - full / offered), the full rate moves on the queueing part of P99
@dataclass(frozen=True)
class SlotuneState:
    ratio: float
    full_rps: float = math.inf   # full answers per second the service carries; inf = no bound yet
    fast_below_rps: float = math.inf   # grow fast only under this: half the full rate the last
    #                                    overload began at (TCP's slow-start threshold)
    cutting: bool = False        # the last window cut the full rate


FULL_CAP = 0.9       # the share of what full answers alone carried busy that the dimmer lets through full
MIXED_MOST = 0.85    # the trial of degrading the excess degrades at most this share (ALL and more: everything)


def _trial(state: SlotuneState, obs: Observation, offered: float):
    """Whether degrading pays is not known yet: under pressure (a queue over the dimmer's
    budget, refusals) with more offered than full answers alone carried busy, first degrade
    the excess over FULL_CAP of that, then, if that did not pay and degrading everything
    could (it carries at most worth x offered), everything. Each trial runs a few windows;
    the verdict then says which pays, if either."""
    v = obs.verdict
    queue = obs.p99_s if obs.queue_p99_s is None else obs.queue_p99_s
    pressed = queue > queue_budget(obs.slo_s, obs.p99_s, queue) or obs.refused_rps > 0 or state.ratio > 0
    if offered <= v.full_rps or not pressed:
        why = (f"{offered:.0f} queries/s offered is within the {v.full_rps:.0f} full answers/s it carried busy"
               if pressed else "no queue over its budget and nothing refused")
        return SlotuneState(0.0), Decision(changed(state.ratio, 0.0, SETTING), f"{why}: nothing degraded ({v.why})")
    if v.mixed is None:
        ratio = clamp(1.0 - FULL_CAP * v.full_rps / offered, DEGRADING + 0.05, MIXED_MOST)
        why = f"trying whether degrading the excess pays: {offered:.0f} queries/s offered, {v.full_rps:.0f} carried full"
    else:
        ratio = 1.0
        why = (f"degrading the excess did not pay; trying everything degraded, which may carry up to "
               f"{obs.worth * offered:.0f} worth/s against up to {v.full_most_rps:.0f} full")
    return (SlotuneState(ratio, offered * (1 - ratio), state.fast_below_rps, False),
            Decision(changed(state.ratio, ratio, SETTING), f"{why} ({v.why})"))


def _slotune_init(settings):
    return SlotuneState(_ratio(settings))


def _slotune_decide(state: SlotuneState, obs: Observation):
    if _idle(obs):
        return state, Decision({}, "no completed requests")
    v, offered = obs.verdict, obs.load_rps or max(obs.arrival_rps, obs.completed_rps)
    if not v.full_known or not v.can_pay(offered, obs.worth):
        # degrading does not pay here (the throttle refuses instead), or it is not known yet
        # what full answers alone carry: the busy windows that say so come first
        why = (f"nothing degraded until it is known what full answers alone carry: {v.why}" if not v.full_known
               else f"degrading does not pay: {v.why}" if v.pays is False
               else f"degrading does not pay at {offered:.0f} queries/s: {v.why}; degrading all would carry at "
                    f"most {obs.worth * offered:.0f} worth/s, full answers alone carried up to {v.full_most_rps:.0f}")
        return SlotuneState(0.0), Decision(changed(state.ratio, 0.0, SETTING), why)
    if v.pays is None:
        return _trial(state, obs, offered)
    queue = obs.p99_s if obs.queue_p99_s is None else obs.queue_p99_s
    budget = queue_budget(obs.slo_s, obs.p99_s, queue)
    slack = 0.1 * budget
    full_now = max(obs.completed_rps - obs.degraded_rps, 0.0)
    before, fast_below = min(state.full_rps, full_now), state.fast_below_rps
    cut = queue > budget or (obs.refused_rps > 0 and state.ratio < 1)
    if cut and not state.cutting and before > 0:   # an overload begins: fast growth stops at half
        fast_below = 0.5 * before                   # this rate (from none, it says nothing about it)
    if queue > budget:
        factor = clamp((budget + slack) / (queue + slack), 0.8, 0.95)
        full = before * factor
        why = f"queue P99 {queue * 1e3:.0f} ms over its {budget * 1e3:.0f} ms budget: full answers x{factor:.2f}"
    elif cut:
        full = before * 0.9
        why = f"{obs.refused_rps:.1f} queries/s refused with the dimmer below 1: full answers x0.90"
    elif state.ratio > 0:   # grow from at least a twentieth of the load: from none, x1.1 alone never would
        # x1.1 at most near the budget; x1.5 under a fifth of it and under half the rate the last
        # overload began at: a dimmer cut deep (a busy host's slower seconds read as queue too)
        # comes back within seconds of the load dropping, and one cut just under the service's
        # capacity does not overshoot it again before the queue shows it
        grown = max(state.full_rps, 0.05 * obs.arrival_rps)
        fast = queue <= 0.2 * budget and grown < fast_below
        factor = clamp((budget + slack) / (queue + slack), 1.0, 1.5 if fast else 1.1)
        full = grown * factor
        why = f"degrading, queue P99 {queue * 1e3:.0f} ms within {budget * 1e3:.0f} ms: full answers x{factor:.2f}"
    else:
        full = state.full_rps
        why = f"queue P99 {queue * 1e3:.0f} ms within {budget * 1e3:.0f} ms"
    if full > FULL_CAP * obs.verdict.full_rps:
        # never more full answers than they alone carried busy, less what the degraded ones take:
        # past that, growing only builds a queue the window's P99 shows seconds late
        full = FULL_CAP * obs.verdict.full_rps
        why += f", at most {FULL_CAP:g} of the {obs.verdict.full_rps:.0f}/s full answers alone carried busy"
    offered = max(obs.arrival_rps, obs.completed_rps)
    ratio = clamp(1.0 - full / offered, 0.0, 1.0) if math.isfinite(full) else 0.0
    if ratio > 0 and state.ratio == 0 and offered <= obs.verdict.full_rps:
        # a queue of bad luck, not of load: degrading starts only past what full answers carried busy
        ratio, why = 0.0, f"{why}; but {offered:.0f} queries/s offered is within the {obs.verdict.full_rps:.0f} " \
                          f"full answers/s it carried busy: nothing degraded"
    if ratio > 0 and state.ratio == 0:
        why += f"; {offered:.0f} queries/s offered over the {full:.0f} full answers/s it carries"
    return SlotuneState(ratio, full, fast_below, cut), Decision(changed(state.ratio, ratio, SETTING), why)


FIELDS = {SETTING: "ratio"}   # Policy.resync writes the degrade_ratio in force here

POLICIES = {
    "slotune": Policy("slotune", "rate of full answers steered by queue-wait P99 under the throttle's target; "
                      "the ratio follows the offered load", _slotune_init, _slotune_decide, fields=FIELDS),
    "whitepaper": Policy("whitepaper", "P99 over the SLO 3 periods in a row: degrade all; back under it: none",
                         _wp_init, _wp_decide, fields=FIELDS),
    "brownout": Policy("brownout", "Klein et al. ICSE 2014 adaptive dimmer controller (pole 0.9, RLS 0.95)",
                       _bo_init, _bo_decide, fields=FIELDS),
}


DEGRADED = "degraded"   # the outcome label of an answer given degraded (still a 200)


def evidence(i: Inputs) -> Verdict:
    """Whether degrading pays on this service (verdict()), from its windows of the last
    EVIDENCE_S: what each carried, how much of it degraded, whether the limiter refused
    and whether its queue wait was over the dimmer's budget. Each window's row is worked
    out once, when it is new."""
    slo = i.conf.spec.slo_p99_s
    lowest = i.lowest_tail()

    def row(w) -> Busy | None:
        if not w.requests or not w.seconds:
            return None
        queue = i.queue_p99([w], w.latency, lowest)
        return Busy(w.requests / w.seconds, i.answers_labelled(w, "outcome", DEGRADED) / w.seconds,
                    (w.requests + w.rejected) / w.seconds, w.rejected > 0,
                    queue > queue_budget(slo, i.quantile(w.latency, 0.99), queue))
    rows = i.per_window("dimmer evidence", row)
    since = i.now - EVIDENCE_S
    worth = i.tuner_option("degrade", "degraded_worth", WORTH)
    return verdict([r for w, r in zip(i.history, rows) if r is not None and w.end > since], worth)


def has_room(ratio: float, v: Verdict, offered_rps: float, worth: float) -> bool:
    """A dimmer at this ratio can still degrade more, and it may pay: the throttle lets it go first."""
    return ratio < 1.0 and (not v.full_known or v.can_pay(offered_rps, worth))


def load(i: Inputs) -> float:
    """Queries offered a second (answered and refused) over the last LOAD_S."""
    ws = list(itertools.takewhile(lambda w: w.end > i.now - LOAD_S, reversed(i.history)))   # newest last
    seconds = sum(w.seconds for w in ws)
    return sum(w.requests + w.rejected for w in ws) / seconds if seconds else 0.0


def room(i: Inputs) -> bool:
    """has_room() for the dimmer running beside the throttle, if one is."""
    return "degrade" in i.running and has_room(i.settings.get(SETTING, 1.0), evidence(i), load(i),
                                               i.tuner_option("degrade", "degraded_worth", WORTH))


def observe(i: Inputs) -> Observation:
    """The throttle's view of the interval plus the answers given degraded: those the
    service's latency histogram labels outcome="degraded" (the dimmer's, and those a
    failed tool degraded)."""
    hist = i.span.latency
    return Observation(
        now=i.now, slo_s=i.conf.spec.slo_p99_s, p99_s=i.quantile(hist, 0.99),
        arrival_rps=i.rate(lambda w: w.requests + w.rejected), completed_rps=i.rate(lambda w: w.requests),
        degraded_rps=i.rate(lambda w: i.answers_labelled(w, "outcome", DEGRADED)),
        refused_rps=i.rate(lambda w: w.rejected), queue_p99_s=i.queue_p99(), verdict=evidence(i),
        worth=i.tuner_option("degrade", "degraded_worth", WORTH), load_rps=load(i))
