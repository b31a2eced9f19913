"""What the daemon knows of each tuner beside its algorithm in tuners/: how its
observation is built, and whether it pushes settings or only raises an alert; the
settings it pushes (per policy) and the keys of its own [services.NAME.tuners.TUNER]
table are its module's SPEC (tuners/base.py Spec), which the config is checked
against. The control loop runs tuners from these; docs/extending.md "Adding a
tuner" walks through one."""
from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable, Mapping

import tuners
from tuners import batch, breaker, budget, continuous_batch, degrade, drift, sampling, throttle
from tuners.base import Option, Policy

from daemon.control import observations
from daemon.store.recorder import DRIFT_METRIC


@dataclass(frozen=True)
class Alert:
    """What an alert-only tuner watches: the metric it names, and reading(observation)
    -> (baseline, value), audited as old -> new and exported as their relative change."""
    metric: str
    reading: Callable[[Any], tuple[float, float]]


@dataclass(frozen=True)
class TunerSpec:
    module: ModuleType                                  # the algorithm: POLICIES, Observation, INTERVAL_S, SPEC
    observe: Callable[[observations.Inputs], Any]       # its Observation, or None: nothing to decide on yet
    alert: Alert | None = None                          # set: it raises and clears an alert, pushes nothing
    # Decision.changes -> the service's settings, for a tuner that decides in its own terms
    to_settings: Callable[[dict[str, float], observations.Inputs], dict[str, float]] | None = None

    @property
    def name(self) -> str:
        return self.module.__name__.rpartition(".")[2]

    @property
    def settings(self) -> tuple[str, ...]:
        return self.module.SPEC.settings

    @property
    def options(self) -> tuple[Option, ...]:
        return self.module.SPEC.options

    @property
    def slos(self) -> tuple[str, ...]:
        return self.module.SPEC.slos

    def policy(self, name: str) -> Policy:
        return tuners.policy(self.name, name)

    def pushes(self, policy: str) -> tuple[str, ...]:
        return self.module.SPEC.pushes(policy)

    def option_values(self, given: Mapping[str, float]) -> dict[str, float]:
        return self.module.SPEC.option_values(given)


def _drift_reading(obs: drift.Observation) -> tuple[float, float]:
    return obs.baseline.mean, obs.value


SPECS = {spec.name: spec for spec in (
    TunerSpec(throttle, observations.for_throttle),
    TunerSpec(batch, observations.for_batch),
    TunerSpec(sampling, observations.for_sampling),
    TunerSpec(breaker, observations.for_breaker),
    TunerSpec(drift, observations.for_drift, alert=Alert(DRIFT_METRIC, _drift_reading)),
    TunerSpec(budget, observations.for_budget, to_settings=observations.budget_timeouts),
    TunerSpec(degrade, observations.for_degrade),
    TunerSpec(continuous_batch, observations.for_continuous_batch),
)}
