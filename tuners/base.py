"""The shape every tuner shares: a Decision, a Policy (pure initial_state/decide pair),
the Spec of what it asks of the service it runs on, and the small helpers the
policies use. Nothing here does I/O or reads a clock."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping


P99_AIM = 0.8   # the overload tuners (throttle, degrade) aim P99 at this share of the SLO


@dataclass(frozen=True)
class Alert:
    """What an alert-only tuner watches (a module's ALERT): the metric it names, and
    reading(observation) -> (baseline, value), audited as old -> new and exported as
    their relative change."""
    metric: str
    reading: Callable[[Any], tuple[float, float]]


@dataclass(frozen=True)
class Decision:
    """What a tuner wants pushed: setting -> new value (empty = no change)."""
    changes: dict[str, float]
    reason: str
    alert: bool = False  # drift: raise an alert for this window


@dataclass(frozen=True)
class Policy:
    """One control rule. `decide(state, observation) -> (state, Decision)` is pure:
    it never mutates `state`, and the same inputs give the same outputs."""
    name: str
    summary: str
    initial_state: Callable[[Mapping[str, float]], Any]
    decide: Callable[[Any, Any], tuple[Any, Decision]]
    # setting -> the state's field that holds it ("breaker.threshold" reaches into a nested state):
    # resync() writes the values actually in force there before each decision.
    fields: Mapping[str, str] = field(default_factory=dict)

    def resync(self, state: Any, settings: Mapping[str, float]) -> Any:
        """The state steering from the settings in force, not from what it last wanted
        (a guard may have clipped it, a hold or a rollback kept the old value, or a dry
        run never pushed it): no wind-up."""
        for setting, path in self.fields.items():
            if setting in settings and math.isfinite(settings[setting]):
                state = _replace_path(state, path.split("."), float(settings[setting]))
        return state

    def held(self, state: Any, setting: str) -> float | None:
        """The value of a setting as the state holds it, or None when it holds none."""
        if setting not in self.fields:
            return None
        for part in self.fields[setting].split("."):
            state = getattr(state, part)
        return float(state)


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
class Spec:
    """What a tuner asks of a service, declared beside its algorithm: the daemon's config
    is checked against it ([services.NAME.tuners.TUNER]), and the control loop pushes what
    it lists."""
    settings: tuple[str, ...] = ()                      # the service's settings it pushes; each needs bounds
    policy_settings: Mapping[str, tuple[str, ...]] = field(default_factory=dict)   # policies pushing others
    options: tuple[Option, ...] = ()                    # the keys of its own table
    slos: tuple[str, ...] = ()                          # the service's SLO keys it steers on; each must be set

    def pushes(self, policy: str) -> tuple[str, ...]:
        return self.policy_settings.get(policy, self.settings)

    def option_values(self, given: Mapping[str, float]) -> dict[str, float]:
        return {o.name: given.get(o.name, o.default) for o in self.options}


def _replace_path(state: Any, path: list[str], value: float) -> Any:
    head, *rest = path
    return replace(state, **{head: _replace_path(getattr(state, head), rest, value) if rest else value})


def clamp(value: float, low: float, high: float) -> float:
    return max(low, min(high, value))


def setting(settings: Mapping[str, float], name: str, tuner: str) -> float:
    """Read one current setting, or fail naming the setting and the tuner."""
    try:
        value = float(settings[name])
    except KeyError:
        raise ValueError(f"{tuner} tuner needs the current value of setting {name!r}; "
                         f"pass it in the settings dict (got {sorted(settings)})") from None
    if not math.isfinite(value):
        raise ValueError(f"{tuner} tuner: setting {name!r} must be a finite number, got {value!r}")
    return value


def changed(old: float, new: float, name: str, rel: float = 1e-9) -> dict[str, float]:
    """{name: new} when it differs from old, else {} (Decision.changes stays empty on no-op)."""
    return {} if abs(new - old) <= rel * max(1.0, abs(old)) else {name: new}
