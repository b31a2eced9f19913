"""A service's run-time settings: names, types, bounds, and all-or-nothing
changes under one lock, each logged as "config change key: old -> new"."""
from __future__ import annotations

import logging
import math
import threading
from dataclasses import dataclass
from typing import Any, Callable

log = logging.getLogger("reference_stack.config")


class SettingError(ValueError):
    """A change a user asked for that cannot be applied; the message names the key and the allowed values."""


@dataclass(frozen=True)
class Setting:
    name: str
    kind: type          # int, float or bool
    low: float
    high: float
    default: Any
    help: str

    def check(self, value: Any) -> Any:
        """The value converted to this setting's type, or SettingError naming the key and the range."""
        if self.kind is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("true", "false", "1", "0"):
                return value.lower() in ("true", "1")
            raise SettingError(f"{self.name}={_shown(value)} is not a boolean; allowed: true or false")
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                raise SettingError(f"{self.name}={_shown(value)} is not a number; allowed range "
                                   f"[{self.low:g}, {self.high:g}]") from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SettingError(f"{self.name}={_shown(value)} is not a number; allowed range [{self.low:g}, {self.high:g}]")
        if isinstance(value, float) and not math.isfinite(value):
            raise SettingError(f"{self.name}={_shown(value)} is not a finite number; allowed range "
                               f"[{self.low:g}, {self.high:g}]")
        if self.kind is int and value != int(value):
            raise SettingError(f"{self.name}={_shown(value)} must be a whole number in [{self.low:g}, {self.high:g}]")
        if not self.low <= value <= self.high:
            raise SettingError(f"{self.name}={_shown(value)} is out of range; allowed range [{self.low:g}, {self.high:g}]")
        return self.kind(value)

    def bounds(self) -> list:
        return [False, True] if self.kind is bool else [self.kind(self.low), self.kind(self.high)]


class Settings:
    """Current values of one service's settings; read them as settings["name"]."""

    def __init__(self, specs: list[Setting], initial: dict[str, Any] | None = None):
        self.specs = {s.name: s for s in specs}
        self._values = {s.name: s.default for s in specs}
        self._lock = threading.Lock()
        self._listeners: list[Callable[[dict[str, Any]], None]] = []
        if initial:
            self._values.update(self._validated(initial))

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return dict(self._values)

    def bounds(self) -> dict[str, list]:
        return {name: spec.bounds() for name, spec in self.specs.items()}

    def on_change(self, listener: Callable[[dict[str, Any]], None]) -> None:
        """listener(changed) runs after each applied change, with {key: new value}."""
        self._listeners.append(listener)

    def _validated(self, changes: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(changes, dict) or not changes:
            raise SettingError("the body must be a non-empty JSON object of setting -> value; "
                               f"settings: {', '.join(sorted(self.specs))}")
        checked = {}
        for key, value in changes.items():
            spec = self.specs.get(key)
            if spec is None:
                raise SettingError(f"unknown setting {key!r}; known settings: {', '.join(sorted(self.specs))}")
            checked[key] = spec.check(value)
        return checked

    def patch(self, changes: dict[str, Any]) -> dict[str, Any]:
        """Apply every change or none; returns the settings after the change."""
        checked = self._validated(changes)
        with self._lock:
            old = dict(self._values)
            self._values.update(checked)
            after = dict(self._values)
            for key, value in checked.items():
                if old[key] != value:
                    log.info("config change %s: %s -> %s", key, old[key], value)
            for listener in self._listeners:
                listener(checked)
        return after


def _shown(value: Any) -> str:
    """A value as a message quotes it: a 10 000-digit number or a long string is cut short."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def parse_assignments(pairs: list[str]) -> dict[str, str]:
    """--set key=value flags as a dict (values are checked when Settings takes them)."""
    out = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SettingError(f"--set {pair!r}: expected key=value, e.g. --set max_batch_size=16")
        out[key.strip()] = value.strip()
    return out
