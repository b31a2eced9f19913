"""The shape every tuner shares: a Decision, a Policy (pure initial_state/decide pair)
and the small helpers the policies use. Nothing here does I/O or reads a clock."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping


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
