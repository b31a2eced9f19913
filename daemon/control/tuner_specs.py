"""The daemon's view of each tuner in tuners.TUNERS: how its observation is built
(its module's `observe`), whether it pushes settings or only raises an alert (its
ALERT), how its decisions become the service's settings (its `to_settings`, where
it decides in its own terms), and the settings it pushes and keys it takes (its
SPEC, tuners/base.py), which the config is checked against. The control loop runs
tuners from these; docs/extending.md "Adding a tuner" walks through one."""
from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable, Mapping

from slotune import tuners
from slotune.tuners.base import Alert, Option, Policy

from slotune.control.observations import Inputs


@dataclass(frozen=True)
class TunerSpec:
    module: ModuleType   # the tuner: POLICIES, Observation, observe, INTERVAL_S, SPEC, maybe ALERT, to_settings

    @property
    def name(self) -> str:
        return self.module.__name__.rpartition(".")[2]

    @property
    def observe(self) -> Callable[[Inputs], Any]:
        """Its Observation from the Inputs, or None: nothing to decide on yet."""
        return self.module.observe

    @property
    def alert(self) -> Alert | None:
        """Set: it raises and clears an alert, and pushes nothing."""
        return getattr(self.module, "ALERT", None)

    @property
    def to_settings(self) -> Callable[[dict[str, float], Inputs], dict[str, float]] | None:
        """Decision.changes -> the service's settings, for a tuner that decides in its own terms."""
        return getattr(self.module, "to_settings", None)

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


SPECS = {name: TunerSpec(module) for name, module in tuners.TUNERS.items()}
