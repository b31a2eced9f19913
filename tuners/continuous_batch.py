"""Continuous-batching tuner: an LLM server's `max_num_seqs` (sequences in the running
batch) and `max_num_batched_tokens` (tokens one step may process: the decodes plus the
prefill chunks) that let the most requests meet both token SLOs, TTFT P99 and TPOT P99
(goodput as DistServe counts it: a request counts when it meets both).

Why the two SLOs pull apart, and how slotune's policy settles it. A step takes about
a + b*tokens + c*seqs (bench/step_time_fit.py); every running sequence waits one step per
token, so TPOT is the step time: it grows with the batch's width (seqs) and with the prefill
chunk that rides along (tokens beyond one per decode). TTFT is the wait for a slot (while
max_num_seqs sequences run, the rest queue) plus the prefill's own steps (a prompt of P
tokens takes about P / (tokens - running) steps). Wider batches and bigger chunks carry more
load (the fixed cost a is shared) and so cut queueing, and they lengthen every step.
The step time is the one resource both SLOs spend, so the policy treats TPOT as a budget.
It reads TPOT from the window's inter-token gaps, not from the requests that finished: a
request's TPOT is known when it ends, a lifetime after the steps that made it, and cutting
again on it overshoots; a request running now gets the window's mean gap as its TPOT. The
mean is averaged over about a request's life (one window of document prefills is diluted in
a request's TPOT too) and starts afresh after each change (the gaps before it describe the
old step).
- TPOT over its target: the step is too long, so shrink it by the overshoot (at most by
  half): the sequences (from the running count) and the token budget (from the steps'
  P99 tokens) by the same factor, which shrinks a + b*tokens + c*seqs by about that factor
  whichever term dominates; but when the steps are mostly prefill (a few decodes beside a
  document's chunks) the width did not make them long, and only the token budget is cut:
  capping the few running sequences would only queue the rest.
- TTFT P99 over its target with TPOT under its own: spend the TPOT headroom, by the share
  that keeps TPOT within its target (a step's time grows at most in proportion to its
  width), on what TTFT waits for: seqs when sequences queue for a slot, tokens when the
  steps are full of prefill.
- Both within target: hold. A setting that is not binding costs nothing, and shrinking it
  would only make the next burst queue.
- The KV cache full or preempting: more sequences cannot all be held, and a preempted one
  recomputes its whole context and stalls its stream: seqs go under the running count the
  cache held, and grow no further while it is nearly full; with TPOT over its target as well, the
  TPOT rule above narrows the step from there (once the token budget alone was cut by the whole
  overshoot: in a load step on the real stack, steps mostly decodes, it went 2048 -> 120 while
  the width stayed, starving every prompt's prefill, bench/llm_tuning.py).
Both over at once is overload that no batch shape clears. While TTFT P99 is within its SLO, or
nobody waits, the TPOT rule wins: a step over the TPOT SLO fails every running request, while
the queue only fails the late. Once requests wait past the TTFT SLO, the queue is lost: what
waits and what runs counts for no goodput whatever its TPOT, and narrowing the step would only
drain it slower and keep the next arrivals waiting behind it, so the width is held (on the real
stack, bench/llm_tuning.py, narrowing 256 -> 7 in a 4x step left 60 waiting and 40 s TTFTs
into the calm after it, where the defaults had drained).

Anchors: "whitepaper", the whitepaper's batch rule (b = ((0.8*SLO - 8.3)/(2.1*1.28))^2,
clamp 1..128, every 30 s) applied to max_num_seqs with the TPOT SLO as the per-batch latency
(a step is the batch every running sequence waits for); its token budget is left as found.
Static anchors (vLLM's defaults, a Sarathi-Serve token budget, the best static grid point)
live in bench/sim/continuous_batch_bench.py: they decide nothing."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from slotune.tuners.base import Decision, Policy, Spec, changed, clamp, setting
from slotune.tuners.batch import whitepaper_size

if TYPE_CHECKING:
    from slotune.control.observations import Inputs

INTERVAL_S = 2.0
SEQS, TOKENS = "max_num_seqs", "max_num_batched_tokens"
SPEC = Spec((SEQS, TOKENS), slos=("slo_ttft_p99_ms", "slo_tpot_p99_ms"))
SEQS_BOUNDS = (1.0, 1024.0)
TOKENS_BOUNDS = (16.0, 65536.0)


@dataclass(frozen=True)
class Observation:
    now: float
    slo_ttft_s: float          # the service's TTFT P99 objective
    slo_tpot_s: float          # its TPOT P99 objective (time per output token)
    ttft_p99_s: float          # of the first tokens of the window (0 when none)
    tpot_p99_s: float          # per request where measured so (the simulator), else per gap (shown, not steered on)
    itl_mean_s: float          # mean gap between two tokens of a sequence, over the window's gaps (0 when none)
    requests: int              # requests the window's quantiles come from
    running: float             # sequences in the running batch, mean over the window
    waiting: float             # sequences waiting to be admitted, mean over the window
    kv_usage: float            # KV cache in use, largest share over the window (0..1)
    preemptions: float         # sequences preempted in the window
    step_tokens: float         # tokens processed by one step (decodes + prefill chunks), mean over the window
    step_tokens_p99: float     # and its P99 over the window's steps


def _read(settings) -> tuple[float, float]:
    tokens = clamp(setting(settings, TOKENS, "continuous_batch"), *TOKENS_BOUNDS)
    return clamp(setting(settings, SEQS, "continuous_batch"), SEQS_BOUNDS[0], min(SEQS_BOUNDS[1], tokens)), tokens


@dataclass(frozen=True)
class State:
    seqs: float
    tokens: float
    last_change: float = -math.inf
    itl_s: float = 0.0      # the windows' inter-token gaps, averaged over about a request's life


def _init(settings):
    return State(*_read(settings))


def _move(state: State, seqs: float, tokens: float, why: str, now: float):
    tokens = clamp(float(round(tokens)), *TOKENS_BOUNDS)
    seqs = clamp(float(round(seqs)), SEQS_BOUNDS[0], min(SEQS_BOUNDS[1], tokens))   # vLLM refuses seqs > tokens
    changes = changed(state.seqs, seqs, SEQS) | changed(state.tokens, tokens, TOKENS)
    if not changes:
        return state, Decision(changes, why)
    return replace(state, seqs=seqs, tokens=tokens, last_change=now, itl_s=0.0), Decision(changes, why)   # gaps before a change say nothing of after


# --- whitepaper 2.3's batch rule on max_num_seqs, the TPOT SLO as the batch's latency, every 30 s
def _no_slos(obs: Observation) -> bool:
    return obs.slo_ttft_s <= 0 or obs.slo_tpot_s <= 0


def _wp_decide(state: State, obs: Observation):
    if _no_slos(obs):
        return state, Decision({}, "the service declares no TTFT and TPOT SLOs")
    if obs.now - state.last_change < 30.0:
        return state, Decision({}, "whitepaper recomputes every 30 s")
    slo_ms = obs.slo_tpot_s * 1e3
    state, decision = _move(state, whitepaper_size(slo_ms), state.tokens, f"b = ((0.8*{slo_ms:.0f} - 8.3)/2.69)^2", obs.now)
    return replace(state, last_change=obs.now), decision


# --- slotune: TPOT is the budget the step time spends; TTFT gets what TPOT leaves
TARGET = 0.85        # aim both P99s at this share of their SLOs
LIFE = 0.5          # weight of the newest window in the gap average (a request lives a few windows)
MAX_GROWTH = 1.5     # largest rise per decision (the TPOT it costs shows only a window later)
MIN_CUT = 0.5        # largest cut per decision
KV_FULL = 0.95       # KV cache share above which more sequences would not fit
# tokens per running sequence past which the prefill chunks, not the batch's width, make a step
# long: a decode costs b + c, about 4.7 prefill tokens on the reference decoder's fit, so past
# 2 + c/b = 5.7 tokens per sequence the chunks take most of the step's time
PREFILL_BOUND = 6.0
TOKEN_FLOOR = 2.0    # the token budget's floor, per running sequence: as many prefill tokens as decodes
SLOT_BOUND = 0.9     # running at this share of max_num_seqs with a queue: sequences wait for a slot
TOKEN_BOUND = 0.9    # steps at this share of max_num_batched_tokens: prefill waits for the budget


def _narrow(seqs: float, tokens: float, tpot: float, obs: Observation, running: float):
    """TPOT over its target by `tpot` (the gap over the target): the step is too long. It takes about
    a + b*tokens + c*seqs, so shrinking both by `cut` shrinks it by about that, at most halved; but steps
    that are mostly prefill were made long by the chunks, not the width: only the token budget then."""
    cut = max(MIN_CUT, 1 / tpot)
    if obs.step_tokens > PREFILL_BOUND * running:
        tokens = max(TOKEN_FLOOR * running, min(tokens, obs.step_tokens_p99) * cut)
        return seqs, tokens, f"TPOT over target, the steps mostly prefill: token budget to {tokens:.0f}"
    seqs, tokens = min(seqs, running * cut), min(tokens, max(obs.step_tokens_p99, running) * cut)
    return seqs, tokens, f"TPOT over target: the step's sequences and tokens x{cut:.2f}"


def _slotune_decide(state: State, obs: Observation):
    if _no_slos(obs) or obs.requests <= 0:
        return state, Decision({}, "the service declares no TTFT and TPOT SLOs" if _no_slos(obs) else
                               "no requests in the window")
    itl = obs.itl_mean_s if state.itl_s <= 0 else LIFE * obs.itl_mean_s + (1 - LIFE) * state.itl_s
    state = replace(state, itl_s=itl)
    tpot = itl / (TARGET * obs.slo_tpot_s)
    ttft = obs.ttft_p99_s / (TARGET * obs.slo_ttft_s)
    running = max(obs.running, 1.0)
    seqs, tokens = state.seqs, state.tokens
    figures = (f"TTFT P99 {obs.ttft_p99_s * 1e3:.0f} ms, TPOT P99 {obs.tpot_p99_s * 1e3:.1f} ms, "
               f"inter-token {obs.itl_mean_s * 1e3:.1f} ms, "
               f"running {obs.running:.0f}, waiting {obs.waiting:.0f}")
    # the queue is lost: what waits (and so what runs) already missed the TTFT SLO and counts for no
    # goodput whatever its TPOT; a narrower step would only serve it slower and keep the next arrivals waiting
    lost = obs.ttft_p99_s > obs.slo_ttft_s and obs.waiting >= 1
    if obs.preemptions > 0 or obs.kv_usage >= KV_FULL:
        seqs = min(seqs, running) * (0.9 if obs.preemptions > 0 else 1.0)
        why = f"KV cache {obs.kv_usage:.0%} full, {obs.preemptions:.0f} preempted: seqs to {seqs:.0f}"
        if tpot > 1 and not lost:
            seqs, tokens, narrowed = _narrow(seqs, tokens, tpot, obs, running)
            why += f"; {narrowed}"
        return _move(state, seqs, tokens, f"{figures}; {why}", obs.now)
    if tpot > 1 and lost:
        return state, Decision({}, f"{figures}; TPOT over target, but requests wait past the TTFT SLO: "
                                   "narrowing would only drain them slower: hold")
    if tpot > 1:
        seqs, tokens, why = _narrow(seqs, tokens, tpot, obs, running)
        return _move(state, seqs, tokens, f"{figures}; {why}", obs.now)
    if ttft > 1:
        grow = min(MAX_GROWTH, 1 / max(tpot, 1e-9))
        if grow <= 1.02:
            return state, Decision({}, f"{figures}; TTFT over target, no TPOT headroom left: hold")
        slot_bound = obs.waiting >= 1 and obs.running >= SLOT_BOUND * seqs
        token_bound = obs.step_tokens_p99 >= TOKEN_BOUND * tokens
        if slot_bound:
            seqs = clamp(max(seqs * grow, seqs + 1), *SEQS_BOUNDS)
            tokens = max(tokens, seqs)
            why = f"TTFT over target, sequences waiting for a slot: seqs x{grow:.2f}"
        elif token_bound:
            tokens = tokens * grow
            why = f"TTFT over target, prefill waiting for the token budget: token budget x{grow:.2f}"
        else:
            return state, Decision({}, f"{figures}; TTFT over target with neither setting binding: hold")
        return _move(state, seqs, tokens, f"{figures}; {why}", obs.now)
    return state, Decision({}, f"{figures}; both within target: hold")


FIELDS = {SEQS: "seqs", TOKENS: "tokens"}   # Policy.resync writes the settings in force here

POLICIES = {
    "slotune": Policy("slotune", "TPOT P99 as the step-time budget: narrow the knob that widened the step when "
                      "it is over; spend its headroom on what TTFT waits for (a slot or the token budget)",
                      _init, _slotune_decide, fields=FIELDS),
    "whitepaper": Policy("whitepaper", "max_num_seqs = ((0.8*TPOT SLO - 8.3)/(2.1*1.28))^2, 1..128, every 30 s",
                         _init, _wp_decide, fields=FIELDS),
}


def observe(i: Inputs) -> Observation:
    """An LLM server's token latencies (the windows' TTFT, one per request, and gaps between
    output tokens, one per gap) and its scheduler's signals: running and waiting sequences,
    KV cache use, preemptions, tokens per step (daemon/profiles names them per product)."""
    ttft, gaps, steps = i.span.ttft, i.span.tpot, i.family_hist("_iteration_tokens")
    return Observation(
        now=i.now, slo_ttft_s=i.conf.spec.slo_ttft_p99_s, slo_tpot_s=i.conf.spec.slo_tpot_p99_s,
        ttft_p99_s=i.quantile(ttft, 0.99), tpot_p99_s=i.quantile(gaps, 0.99),
        itl_mean_s=gaps.mean() if gaps is not None and gaps.count else 0.0,
        requests=int(ttft.count) if ttft is not None else 0,
        running=i.gauge_mean("_num_requests_running"), waiting=i.gauge_mean("_num_requests_waiting"),
        kv_usage=i.gauge_max("_kv_cache_usage_ratio") or 0.0, preemptions=i.family_sum("_num_preemptions_total"),
        step_tokens=steps.mean() if steps is not None and steps.count else 0.0,
        step_tokens_p99=i.quantile(steps, 0.99))
