"""slotune's tuners: pure control algorithms, one module per tuner, each declaring
all of itself: its Observation and how it is built from the daemon's Inputs
(`observe`), its POLICIES (slotune's own, the whitepaper rule and published
anchors), INTERVAL_S, its SPEC (the settings it pushes, its own keys, the SLOs it
steers on), and ALERT for one that only raises alerts or to_settings for one that
decides in its own terms. Every module here with POLICIES is a tuner: TUNERS
finds it, and the config, the control loop and the tests take it from there.

    from slotune.tuners import TUNERS, policy
    p = policy("throttle")                      # slotune's default
    state = p.initial_state({"concurrency_limit": 32})
    state, decision = p.decide(state, throttle.Observation(...))
"""
from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

from slotune.tuners.base import Decision, Policy

TUNERS: dict[str, ModuleType] = {}
for _found in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    _module = importlib.import_module(f"{__name__}.{_found.name}")
    if hasattr(_module, "POLICIES"):
        TUNERS[_found.name] = _module


def policy(tuner: str, name: str = "slotune") -> Policy:
    """The named policy of a tuner; ValueError naming the valid choices otherwise."""
    if tuner not in TUNERS:
        raise ValueError(f"unknown tuner {tuner!r}; valid tuners: {', '.join(TUNERS)}")
    policies = TUNERS[tuner].POLICIES
    if name not in policies:
        raise ValueError(f"unknown policy {name!r} for tuner {tuner!r}; valid policies: {', '.join(policies)}")
    return policies[name]


__all__ = ["TUNERS", "policy", "Decision", "Policy"]
