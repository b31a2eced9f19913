"""Budget scenarios: requests cross gateway -> tool -> inference with lognormal latencies;
each hop enforces its budget (weight x end-to-end SLO) as a deadline. Goodput = share of
requests that meet the end-to-end SLO without any hop blowing its budget; false kills =
requests a hop deadline killed that would have met the end-to-end SLO."""
from __future__ import annotations

import numpy as np

from slotune.tuners import budget

SCENARIOS = ("matched", "mismatched", "shift", "heavy_tail", "low_traffic")
POLICIES = ("slotune", "whitepaper", "equal")
METRICS = (("goodput_ratio", "goodput", "high"), ("false_kills", "false kills", "low"))
PRIMARY = "goodput_ratio"
HOPS = ("gateway", "tool", "inference")
SLO = 1.0


def _hops(scenario: str, duration: int):
    """Per-second lognormal medians (hops x seconds), sigmas, hop SLOs and request rate."""
    medians = np.tile(np.array([[0.03], [0.10], [0.25]]), duration)
    sigmas = np.array([0.3, 0.5, 0.4])
    slos = (0.1, 0.3, 0.6)  # proportional to the real latencies
    rate = 100
    if scenario == "mismatched":   # hop SLOs written by hand, equal: not what the hops need
        slos = (0.4, 0.4, 0.4)
    elif scenario == "shift":      # inference slows 1.5x a third of the way in
        medians[2, duration // 3:] *= 1.5
    elif scenario == "heavy_tail":
        sigmas = np.array([0.3, 1.0, 0.4])
    elif scenario == "low_traffic":
        rate = 3
    elif scenario != "matched":
        raise ValueError(f"unknown budget scenario {scenario!r}; use one of {SCENARIOS}")
    return medians, sigmas, slos, rate


def run_one(policy_name: str, scenario: str, seed: int, quick: bool) -> dict[str, float]:
    duration = 120 if quick else 300
    rng = np.random.default_rng(seed)
    medians, sigmas, slos, rate = _hops(scenario, duration)
    policy = budget.POLICIES[policy_name]
    start = {budget.PREFIX + h: 1 / 3 for h in HOPS}
    state = policy.initial_state(start)
    weights = np.full(len(HOPS), 1 / 3)
    good = kills = total = 0
    window: list[np.ndarray] = []
    for sec in range(duration):
        n = rng.poisson(rate)
        lat = rng.lognormal(np.log(medians[:, sec])[:, None], sigmas[:, None], (len(HOPS), n))
        over = (lat > weights[:, None] * SLO).any(axis=0)
        e2e_ok = lat.sum(axis=0) <= SLO
        good += np.count_nonzero(e2e_ok & ~over)
        kills += np.count_nonzero(e2e_ok & over)
        total += n
        window.append(lat)
        if (sec + 1) % int(budget.INTERVAL_S) == 0:
            seen = np.concatenate(window, axis=1)
            p50, p99 = (np.quantile(seen, (0.5, 0.99), axis=1) if seen.shape[1] else np.zeros((2, len(HOPS))))
            obs = budget.Observation(now=sec + 1.0, slo_s=SLO, hop_slos_s=tuple(zip(HOPS, slos)),
                                     hop_p50_s=tuple(zip(HOPS, map(float, p50))),
                                     hop_p99_s=tuple(zip(HOPS, map(float, p99))))
            state, decision = policy.decide(state, obs)
            for i, hop in enumerate(HOPS):
                weights[i] = decision.changes.get(budget.PREFIX + hop, weights[i])
            window = []
    return {"goodput_ratio": good / max(1, total), "false_kills": kills / max(1, total)}
