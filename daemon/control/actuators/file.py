"""Writes settings to a JSON file atomically (temp file, fsync, rename) and
optionally signals the service so it re-reads it: for services whose only
control surface is a file."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from daemon.control.actuators import ActuatorError
from daemon.config import signal_number


class FileActuator:
    def __init__(self, path: str, pid_file: str = "", signal: str = ""):
        self.path, self.pid_file = Path(path), pid_file
        self.signal = signal_number(signal) if signal else None

    def current(self) -> dict[str, float]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise ActuatorError(f"cannot read {self.path}: {exc}") from None
        return {k: float(v) for k, v in data.items() if isinstance(v, (int, float))}

    def push(self, changes: dict[str, float]) -> None:
        merged = {**self.current(), **changes}
        try:
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
            with os.fdopen(fd, "w") as f:
                json.dump(merged, f, indent=2, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except OSError as exc:
            raise ActuatorError(f"cannot write {self.path}: {exc}") from None
        if self.signal is not None and self.pid_file:
            try:
                os.kill(int(Path(self.pid_file).read_text().split()[0]), self.signal)
            except (OSError, ValueError, IndexError) as exc:
                raise ActuatorError(f"wrote {self.path} but could not signal the pid in {self.pid_file}: {exc}") from None

