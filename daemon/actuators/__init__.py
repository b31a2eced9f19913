"""Actuators push a service's new settings through its own control surface. Each
is one module here that declares all of itself: KIND (its [control] kind), OPTIONS
(the [control] keys it takes, each with what it is; the config checks them),
TARGETS (whether it takes a [control.targets] table of setting -> what the
setting is on the service, and target_error() to check one), and
from_control(control, owns) -> the actuator. Each reads the current values and
pushes a change as one all-or-nothing call (verified()); failures raise
ActuatorError so the control loop can back off and retry. ACTUATORS finds every
module here with a KIND."""
from __future__ import annotations

import importlib
import math
import pkgutil
from dataclasses import dataclass, field
from types import ModuleType
from typing import Callable, Protocol

from slotune.model.errors import ActuatorError as ActuatorError


class Actuator(Protocol):
    def current(self) -> dict[str, float]: ...

    def push(self, changes: dict[str, float]) -> None: ...


@dataclass(frozen=True)
class Option:
    """One [control] key an actuator takes: what it is (said when it is missing), its
    default (a key that has one may not be set empty), its choices, and check(value) ->
    why it cannot be ("is not ..."), or None."""
    what: str
    required: bool = False
    default: str = ""
    choices: tuple[str, ...] = ()
    check: Callable[[str], str | None] | None = None


@dataclass(frozen=True)
class Targets:
    """An actuator's [control.targets] table: an example of one entry, and whether it needs one."""
    example: str
    required: bool = False


@dataclass(frozen=True)
class Control:
    """A service's [control] table: its actuator's kind, the keys that kind declares
    (every one, defaults filled in), and its targets."""
    kind: str
    options: dict[str, str] = field(default_factory=dict)
    targets: dict[str, str] = field(default_factory=dict)   # setting -> what it is on the service


def http_url(value: str) -> str | None:
    """An Option check: an http(s) URL."""
    return None if value.startswith(("http://", "https://")) else "is not an http(s) URL"


def for_control(control: Control, owns: Callable[[int], bool] | None = None) -> Actuator:
    """owns(pid): whether pid is one of the service's own processes (the only ones an actuator signals)."""
    return ACTUATORS[control.kind].from_control(control, owns)


def on_service(changes: dict[str, float], targets: dict[str, str]) -> dict[str, float]:
    """The changes under the names the service has for them (a setting without a target: its own)."""
    return {targets.get(k, k): v for k, v in changes.items()}


def as_settings(values: dict[str, float], targets: dict[str, str]) -> dict[str, float]:
    """Values under the service's names, under the settings' names."""
    back = {t: s for s, t in targets.items()}
    return {back.get(k, k): v for k, v in values.items()}


def verified(changes: dict[str, float], write: Callable[[], None], read: Callable[[], dict[str, float]],
             restore: Callable[[], None], where: str) -> None:
    """write(), then read() must show every change in force; on any failure restore() what
    was there before and say whether that landed: never half-applied without saying so."""
    try:
        write()
        read_back(changes, read(), where)
    except ActuatorError as exc:
        try:
            restore()
            then = "the previous values are back"
        except ActuatorError as again:
            then = f"putting the previous values back FAILED ({again})"
        raise ActuatorError(f"{exc}; {then}", exc.unreachable) from None


def read_back(pushed: dict[str, float], in_force: dict[str, float], where: str) -> None:
    """ActuatorError unless every pushed value is the one the service now reports."""
    wrong = [f"{k} = {in_force.get(k, 'nothing')} (pushed {plain(v)})" for k, v in pushed.items()
             if k not in in_force or not math.isclose(in_force[k], v, rel_tol=1e-9, abs_tol=1e-9)]
    if wrong:
        raise ActuatorError(f"{where} read back {', '.join(wrong)}", unreachable=False)


def numeric_settings(settings: object, where: str) -> dict[str, float]:
    """The numeric settings in a service's answer, as floats. Booleans, strings and other
    values are not settings slotune tunes and are left out (true is not 1.0); anything that
    is not a JSON object, or a number that is not finite, raises ActuatorError naming where."""
    if not isinstance(settings, dict):
        raise ActuatorError(f"{where}: expected a JSON object of setting -> value, got {_json_kind(settings)}",
                            unreachable=False)
    out = {}
    for key, value in settings.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        try:
            number = float(value)
        except OverflowError:       # an integer too large for a float
            number = math.inf
        if not math.isfinite(number):
            raise ActuatorError(f"{where}: setting {key[:80]!r} is not a finite number", unreachable=False)
        out[key] = number
    return out


def _json_kind(value: object) -> str:
    if value is None:
        return "null (or nothing)"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, list):
        return "a list"
    return "a string" if isinstance(value, str) else "a number"


def plain(value: float) -> float | int:
    """Whole numbers go out as JSON integers (batch sizes, limits)."""
    return int(value) if float(value).is_integer() else value


def _found() -> dict[str, ModuleType]:
    """Every module here that declares a KIND, by kind."""
    out = {}
    for module in pkgutil.iter_modules(__path__):
        loaded = importlib.import_module(f"{__name__}.{module.name}")
        if hasattr(loaded, "KIND"):
            out[loaded.KIND] = loaded
    return dict(sorted(out.items()))


ACTUATORS: dict[str, ModuleType] = _found()
