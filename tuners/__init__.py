"""slotune's tuners: pure control algorithms, one module per tuner, each with the
whitepaper rule and published anchors beside slotune's own policy ("slotune").

    from tuners import TUNERS, policy
    p = policy("throttle")                      # slotune's default
    state = p.initial_state({"concurrency_limit": 32})
    state, decision = p.decide(state, throttle.Observation(...))
"""
from __future__ import annotations

from tuners import batch, breaker, budget, continuous_batch, degrade, drift, sampling, throttle
from tuners.base import Decision, Policy

TUNERS = {"throttle": throttle, "batch": batch, "sampling": sampling,
          "breaker": breaker, "drift": drift, "budget": budget, "degrade": degrade,
          "continuous_batch": continuous_batch}


def policy(tuner: str, name: str = "slotune") -> Policy:
    """The named policy of a tuner; ValueError naming the valid choices otherwise."""
    if tuner not in TUNERS:
        raise ValueError(f"unknown tuner {tuner!r}; valid tuners: {', '.join(TUNERS)}")
    policies = TUNERS[tuner].POLICIES
    if name not in policies:
        raise ValueError(f"unknown policy {name!r} for tuner {tuner!r}; valid policies: {', '.join(policies)}")
    return policies[name]


__all__ = ["TUNERS", "policy", "Decision", "Policy"]
