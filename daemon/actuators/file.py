"""Writes settings into a service's JSON settings file and optionally signals the
service so it re-reads it: for services whose only control surface is a file.
A push changes only the tuned keys (every other value, the key order, the file's
mode and owner stay) in one atomic replace (temp file, fsync, rename, fsync of the
folder); the signal goes, by pidfd, only to one of the service's own processes."""
from __future__ import annotations

import json
import os
import re
import signal as signals
from pathlib import Path
from typing import Callable

from slotune.actuators import ActuatorError, Control, Option, numeric_settings, plain
from slotune.host.safe_files import read_regular, replace_file
from slotune.host.untrusted import Untrusted, json_value

SETTINGS_MAX_BYTES = 1 << 20
PID_FILE_MAX_BYTES = 64


def signal_number(name: str) -> int | None:
    """HUP, SIGHUP, hup -> signal.SIGHUP; None when there is no such signal."""
    found = getattr(signals, "SIG" + name.upper().removeprefix("SIG"), None)
    return int(found) if isinstance(found, signals.Signals) else None


def _signal_error(name: str) -> str | None:
    return None if signal_number(name) is not None else "is not a signal name; use e.g. HUP or USR1"


KIND = "file"
OPTIONS = {"path": Option("the settings file path", required=True),
           "pid_file": Option("a file holding the pid of the service process to signal after a write"),
           "signal": Option("the signal that makes it re-read the file, e.g. HUP", check=_signal_error)}
TARGETS = None


def from_control(control: Control, owns: Callable[[int], bool] | None = None) -> "FileActuator":
    o = control.options
    return FileActuator(o["path"], o["pid_file"], o["signal"], owns)


class FileActuator:
    """owns(pid): whether pid is one of the service's own processes; without it nothing is signalled."""

    def __init__(self, path: str, pid_file: str = "", signal: str = "",
                 owns: Callable[[int], bool] | None = None):
        self.path, self.pid_file, self.owns = Path(path), pid_file, owns
        self.signal = signal_number(signal) if signal else None

    def _read(self) -> tuple[dict, os.stat_result | None]:
        """The file's settings as JSON has them (a missing file has none yet) and its status."""
        try:
            data, st = read_regular(str(self.path), "settings file", SETTINGS_MAX_BYTES)
        except FileNotFoundError:
            return {}, None
        try:
            settings = json_value(data, f"settings file {self.path}", SETTINGS_MAX_BYTES)
        except Untrusted as exc:
            raise ActuatorError(str(exc), unreachable=False) from None
        numeric_settings(settings, f"settings file {self.path}")
        return settings, st

    def current(self) -> dict[str, float]:
        return numeric_settings(self._read()[0], f"settings file {self.path}")

    def push(self, changes: dict[str, float]) -> None:
        settings, st = self._read()
        pidfd = self._service_process() if self.signal is not None and self.pid_file else None
        try:
            self._write({**settings, **{k: _like(settings.get(k), v) for k, v in changes.items()}}, st)
            if pidfd is not None and self.signal is not None:
                try:
                    signals.pidfd_send_signal(pidfd, self.signal)
                except OSError as exc:
                    raise ActuatorError(f"wrote {self.path} but could not signal the process in "
                                        f"{self.pid_file}: {exc.strerror}") from None
        finally:
            if pidfd is not None:
                os.close(pidfd)

    def _write(self, settings: dict, st: os.stat_result | None) -> None:
        """A string the file had as an escaped lone surrogate ("\\ud800", not UTF-8) goes back as that escape."""
        text = json.dumps(settings, indent=2, ensure_ascii=False) + "\n"
        replace_file(str(self.path), text.encode(errors="backslashreplace"), st, "settings file")

    def _service_process(self) -> int:
        """A pidfd on the process the pid file names, once it is known to be one of the service's own."""
        try:
            data, _ = read_regular(self.pid_file, "pid file", PID_FILE_MAX_BYTES)
        except FileNotFoundError:
            raise ActuatorError(f"pid file {self.pid_file} does not exist (is the service running?); "
                                f"nothing was written") from None
        first = (data.split() or [b""])[0]
        if not re.fullmatch(rb"[+-]?[0-9]{1,10}", first):
            raise ActuatorError(f"pid file {self.pid_file} does not hold a process id (it starts {first[:20]!r}); "
                                "the service must write its pid there; nothing was written", unreachable=False)
        pid = int(first)
        if pid <= 1 or pid == os.getpid():
            raise ActuatorError(f"pid file {self.pid_file} names pid {pid}, which slotune never signals "
                                "(0 and negative ids reach whole groups or every process, 1 is init, "
                                f"{os.getpid()} is slotune); the pid file must hold the service's own pid; "
                                "nothing was written", unreachable=False)
        try:
            pidfd = os.pidfd_open(pid)
        except OSError as exc:
            raise ActuatorError(f"pid file {self.pid_file} names pid {pid}: {exc.strerror} (is the service "
                                "running?); nothing was written") from None
        if self.owns is None or not self.owns(pid):
            os.close(pidfd)
            raise ActuatorError(f"pid file {self.pid_file} names pid {pid}, which is not one of this service's "
                                "processes (as its cmdline, systemd_unit, cgroup or port find them); slotune "
                                "signals only those: fix the pid file or the service's declaration; "
                                "nothing was written", unreachable=False)
        return pidfd


def _like(old: object, value: float) -> float | int:
    """The new value in the kind the file had: a float stays a float, else whole numbers are integers."""
    return float(value) if isinstance(old, float) else plain(value)
