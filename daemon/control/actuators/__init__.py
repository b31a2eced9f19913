"""Actuators push a service's new settings through its own control surface.
Each reads the current values and pushes a change as one all-or-nothing call;
failures raise ActuatorError so the control loop can back off and retry."""
from __future__ import annotations

import importlib
import math
from typing import Callable, Protocol

from daemon.config import Control
from daemon.model.errors import ActuatorError as ActuatorError
from daemon.profiles import SURFACES


class Actuator(Protocol):
    def current(self) -> dict[str, float]: ...

    def push(self, changes: dict[str, float]) -> None: ...


def for_control(control: Control, owns: Callable[[int], bool] | None = None) -> Actuator:
    """owns(pid): whether pid is one of the service's own processes (the only ones a file actuator signals)."""
    from daemon.control.actuators.file import FileActuator
    from daemon.control.actuators.http_json import HttpJsonActuator
    if control.kind == "file":
        return FileActuator(control.path, control.pid_file, control.signal, owns)
    if control.kind in SURFACES:
        return _surface(control.kind).from_control(control)
    return HttpJsonActuator(control.url, control.token_file, control.method,
                            settings_key="settings" if control.kind == "reference" else "")


def _surface(kind: str):
    """The module of that name here, which has from_control(Control)."""
    return importlib.import_module(f"daemon.control.actuators.{kind}")


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
    return {list: "a list", str: "a string"}.get(type(value), "a number")


def plain(value: float) -> float | int:
    """Whole numbers go out as JSON integers (batch sizes, limits)."""
    return int(value) if float(value).is_integer() else value
