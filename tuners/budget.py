"""Budget tuner: split an end-to-end latency SLO into per-hop budgets (gateway, tools,
inference) that the hops enforce as deadlines.

Settings it changes: "budget_weight.<hop>" for each hop, weights summing to 1
(hop budget = weight x end-to-end SLO)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from slotune.tuners.base import Decision, Option, Policy, Spec, changed

if TYPE_CHECKING:
    from slotune.control.observations import Inputs

INTERVAL_S = 10.0
PREFIX = "budget_weight."
# The hops on a service that times its stages (`*_stage_duration_seconds{stage}`, as the
# reference gateway does): hop -> (the stage that measures it, the timeout that cuts it
# off). Every other stage (intent gate, cache lookups) is the gateway's own work, the OWN_HOP:
# budgeted, never cut off. The tools stage is a query's tool DAG with each call under the
# timeout: its lookups run side by side, so it overruns when one call does.
HOPS = {"tool": ("tools", "tool_timeout_ms"), "llm": ("llm", "llm_timeout_ms")}
OWN_HOP = "gateway"
SPEC = Spec(tuple(s for _, s in HOPS.values()), options=(
    Option("gateway_slo_ms", 100.0, 0.1, 600_000.0, "the gateway's own work's SLO"),
    Option("tool_slo_ms", 300.0, 0.1, 600_000.0, "a query's tool calls' SLO"),
    Option("llm_slo_ms", 600.0, 0.1, 600_000.0, "the LLM call's SLO")))


@dataclass(frozen=True)
class Observation:
    now: float
    slo_s: float                                  # end-to-end SLO
    hop_slos_s: tuple[tuple[str, float], ...]     # (hop, its own SLO), the whitepaper's input
    hop_p50_s: tuple[tuple[str, float], ...] = ()  # (hop, P50 latency measured in the window; 0 = none)
    hop_p99_s: tuple[tuple[str, float], ...] = ()  # (hop, P99 latency measured in the window; 0 = none)


def _init(settings):
    weights = {k[len(PREFIX):]: float(v) for k, v in settings.items() if k.startswith(PREFIX)}
    for hop, w in weights.items():
        if not 0 <= w <= 1:
            raise ValueError(f"budget tuner: setting {PREFIX}{hop} = {w} is outside 0..1")
    return weights


def _normalise(raw: dict[str, float]) -> dict[str, float]:
    total = sum(raw.values())
    if total <= 0:
        raise ValueError(f"budget tuner: per-hop values {raw} sum to {total}; give each hop a positive SLO")
    return {hop: v / total for hop, v in raw.items()}


def _push(state: dict[str, float], new: dict[str, float], why: str):
    changes: dict[str, float] = {}
    for hop, w in new.items():
        changes |= changed(state.get(hop, -1.0), w, PREFIX + hop, rel=1e-6)
    return new, Decision(changes, why)


def _wp_decide(state, obs: Observation):
    return _push(state, _normalise(dict(obs.hop_slos_s)), "weights proportional to per-hop SLOs")


def _equal_decide(state, obs: Observation):
    hops = [hop for hop, _ in obs.hop_slos_s]
    return _push(state, {hop: 1 / len(hops) for hop in hops}, "equal split")


# --- slotune: fewest deadline misses. Fit each hop's latency as lognormal from its P50 and
# P99; the budgets b_i that minimise sum_i P(hop i > b_i) under sum_i b_i = SLO are where
# every hop's density is equal (Lagrange), found by bisection. The SLO split until every
# hop has data, the fit at once on the first full window, smoothed after that.
SMOOTH = 0.3
Z99 = 2.326


def _lognormal(p50: float, p99: float) -> tuple[float, float]:
    return math.log(p50), max(math.log(p99 / p50) / Z99, 1e-6)


def _log_density(log_x: float, mu: float, sigma: float) -> float:
    return -((log_x - mu) ** 2) / (2 * sigma * sigma) - log_x - math.log(sigma * math.sqrt(2 * math.pi))


def _point_at_density(log_lam: float, mu: float, sigma: float) -> float:
    """x above the mode where the lognormal density falls to exp(log_lam) (the mode if never)."""
    lo, hi = mu - sigma * sigma, mu + 12 * sigma
    if _log_density(lo, mu, sigma) <= log_lam:
        return math.exp(lo)
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _log_density(mid, mu, sigma) > log_lam else (lo, mid)
    return math.exp(lo)


def least_miss_weights(slo_s: float, fits: dict[str, tuple[float, float]]) -> dict[str, float]:
    """fits: hop -> (p50, p99). Weights (budget / SLO) with equal densities at the budgets."""
    params = {hop: _lognormal(*f) for hop, f in fits.items()}

    def budgets(log_lam: float) -> dict[str, float]:
        return {hop: _point_at_density(log_lam, mu, sg) for hop, (mu, sg) in params.items()}
    lo, hi = -60.0, 20.0  # log density: low = far tails (big budgets), high = near the modes
    if sum(budgets(hi).values()) >= slo_s:  # even the modes overrun the SLO: split by the modes
        return _normalise(budgets(hi))
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sum(budgets(mid).values()) > slo_s else (lo, mid)
    return _normalise(budgets(hi))


@dataclass(frozen=True)
class LearnedWeights:
    weights: dict[str, float]
    learned: bool = False   # False: still on the SLO split


def _slotune_init(settings):
    return LearnedWeights(_init(settings))


def _slotune_decide(state: LearnedWeights, obs: Observation):
    prior = _normalise(dict(obs.hop_slos_s))
    p50, p99 = dict(obs.hop_p50_s), dict(obs.hop_p99_s)
    fits = {hop: (p50[hop], max(p99[hop], p50[hop])) for hop in prior if p50.get(hop, 0) > 0 and p99.get(hop, 0) > 0}
    if len(fits) < len(prior):
        if state.learned:
            return state, Decision({}, "not every hop has latency data: weights held")
        weights, why = prior, "no latency data yet: split by per-hop SLOs"
    else:
        now = least_miss_weights(obs.slo_s, fits)
        weights = (_normalise({hop: (1 - SMOOTH) * state.weights.get(hop, prior[hop]) + SMOOTH * now[hop]
                               for hop in prior}) if state.learned else now)
        why = "fewest expected deadline misses, from per-hop lognormal fits"
    nxt, decision = _push(state.weights, weights, why)
    return LearnedWeights(nxt, state.learned or len(fits) == len(prior)), decision


POLICIES = {
    "slotune": Policy("slotune", "budgets at equal latency density (fewest misses) from per-hop P50/P99 fits",
                      _slotune_init, _slotune_decide),
    "whitepaper": Policy("whitepaper", "weights proportional to per-hop SLO, normalised to 1", _init, _wp_decide),
    "equal": Policy("equal", "the same share for every hop", _init, _equal_decide),
}


def observe(i: Inputs) -> Observation:
    """Each hop's P50 and P99 over the interval (0: no calls, the tuner waits for data); the
    own hop's are the sums of its stages' (as if its stages were slow together). The hops
    are the stages the service times in `*_stage_duration_seconds{stage}`."""
    stages = i.by_label("_stage_duration_seconds", "stage")
    measured = {stage for stage, _ in HOPS.values()}
    own = [h for stage, h in stages.items() if stage not in measured]
    quantiles = {OWN_HOP: (sum(i.quantile(h, 0.5) for h in own), sum(i.quantile(h, 0.99) for h in own))}
    quantiles |= {hop: (i.quantile(stages.get(stage), 0.5), i.quantile(stages.get(stage), 0.99))
                  for hop, (stage, _) in HOPS.items()}
    return Observation(
        now=i.now, slo_s=i.conf.spec.slo_p99_s,
        hop_slos_s=tuple((hop, i.options[f"{hop}_slo_ms"] / 1000.0) for hop in quantiles),
        hop_p50_s=tuple((hop, p50) for hop, (p50, _) in quantiles.items()),
        hop_p99_s=tuple((hop, p99) for hop, (_, p99) in quantiles.items()))


def to_settings(changes: dict[str, float], i: Inputs) -> dict[str, float]:
    """The weights as the timeouts that enforce them: weight x the service's P99 SLO, in
    ms. The own hop's weight stays free for the gateway's own work."""
    slo_ms = i.conf.spec.slo_p99_s * 1000.0
    return {setting: changes[PREFIX + hop] * slo_ms for hop, (_, setting) in HOPS.items() if PREFIX + hop in changes}
