"""Actuators push a service's new settings through its own control surface.
Each reads the current values and pushes a change as one all-or-nothing call;
failures raise ActuatorError so the control loop can back off and retry."""
from __future__ import annotations

from typing import Protocol

from daemon.config import Control


class ActuatorError(RuntimeError):
    """unreachable: the surface did not answer (back off and retry); else it refused the change."""

    def __init__(self, message: str, unreachable: bool = True):
        super().__init__(message)
        self.unreachable = unreachable


class Actuator(Protocol):
    def current(self) -> dict[str, float]: ...

    def push(self, changes: dict[str, float]) -> None: ...


def for_control(control: Control) -> Actuator:
    from daemon.control.actuators.file import FileActuator
    from daemon.control.actuators.http_json import HttpJsonActuator
    if control.kind == "file":
        return FileActuator(control.path, control.pid_file, control.signal)
    return HttpJsonActuator(control.url, control.token_file, control.method,
                            settings_key="settings" if control.kind == "reference" else "")
