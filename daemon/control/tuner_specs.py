"""What the daemon knows of each tuner beside its algorithm in tuners/: the settings
it pushes (per policy), the keys of its own [services.NAME.tuners.TUNER] table, how
its observation is built, and whether it pushes settings or only raises an alert.
The config is checked against these specs and the control loop runs tuners from
them; docs/extending.md "Adding a tuner" walks through one."""
from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable, Mapping

import tuners
from tuners import batch, breaker, budget, continuous_batch, degrade, drift, sampling, throttle
from tuners.base import Policy

from daemon.control import observations
from daemon.store.recorder import DRIFT_METRIC


@dataclass(frozen=True)
class Option:
    """One key of the tuner's own table, with its default and its range."""
    name: str
    default: float
    low: float
    high: float
    help: str
    kind: type = float


@dataclass(frozen=True)
class Alert:
    """What an alert-only tuner watches: the metric it names, and reading(observation)
    -> (baseline, value), audited as old -> new and exported as their relative change."""
    metric: str
    reading: Callable[[Any], tuple[float, float]]


@dataclass(frozen=True)
class TunerSpec:
    module: ModuleType                                  # the algorithm: POLICIES, Observation, INTERVAL_S
    observe: Callable[[observations.Inputs], Any]       # its Observation, or None: nothing to decide on yet
    settings: tuple[str, ...] = ()                      # the service's settings it pushes; each needs bounds
    policy_settings: Mapping[str, tuple[str, ...]] = field(default_factory=dict)   # policies pushing others
    options: tuple[Option, ...] = ()
    alert: Alert | None = None                          # set: it raises and clears an alert, pushes nothing
    # Decision.changes -> the service's settings, for a tuner that decides in its own terms
    to_settings: Callable[[dict[str, float], observations.Inputs], dict[str, float]] | None = None
    slos: tuple[str, ...] = ()                          # the service's SLO keys it steers on; each must be set

    @property
    def name(self) -> str:
        return self.module.__name__.rpartition(".")[2]

    def policy(self, name: str) -> Policy:
        return tuners.policy(self.name, name)

    def pushes(self, policy: str) -> tuple[str, ...]:
        return self.policy_settings.get(policy, self.settings)

    def option_values(self, given: Mapping[str, float]) -> dict[str, float]:
        return {o.name: given.get(o.name, o.default) for o in self.options}


def _drift_reading(obs: drift.Observation) -> tuple[float, float]:
    return obs.baseline.mean, obs.value


SPECS = {spec.name: spec for spec in (
    TunerSpec(throttle, observations.for_throttle, ("concurrency_limit",), {"whitepaper": ("rate_limit_rps",)}),
    TunerSpec(batch, observations.for_batch, ("max_batch_size", "max_queue_delay_ms")),
    TunerSpec(sampling, observations.for_sampling, ("trace_sample_rate", "trace_keep_slower_than_s"),
              options=(Option("budget_traces_per_s", 10.0, 0.001, 1e6, "traces/s to keep"),)),
    TunerSpec(breaker, observations.for_breaker,
              ("breaker_failure_threshold", "breaker_consecutive_failures", "breaker_open_s"),
              options=(Option("slo_failure_rate", 0.003, 0.0, 1.0, "a tool's failure-rate objective"),)),
    TunerSpec(drift, observations.for_drift, alert=Alert(DRIFT_METRIC, _drift_reading),
              options=(Option("baseline_days", 7.0, 0.001, 365.0, "how far back the baseline reaches"),)),
    TunerSpec(budget, observations.for_budget, tuple(s for _, s in observations.BUDGET_HOPS.values()),
              to_settings=observations.budget_timeouts, options=(
                  Option("gateway_slo_ms", 100.0, 0.1, 600_000.0, "the gateway's own work's SLO"),
                  Option("tool_slo_ms", 300.0, 0.1, 600_000.0, "a query's tool calls' SLO"),
                  Option("llm_slo_ms", 600.0, 0.1, 600_000.0, "the LLM call's SLO"))),
    TunerSpec(degrade, observations.for_degrade, (degrade.SETTING,)),
    TunerSpec(continuous_batch, observations.for_continuous_batch, (continuous_batch.SEQS, continuous_batch.TOKENS),
              slos=("slo_ttft_p99_ms", "slo_tpot_p99_ms")),
)}

# The settings that admit requests: a service whose engine has no live knob for them
# names the proxy in front of it (admission_by), and they are pushed there.
ADMISSION = frozenset(s for policy in SPECS["throttle"].module.POLICIES for s in SPECS["throttle"].pushes(policy))
