"""The audit log: one JSON line per decision (what, old -> new, why, outcome),
appended and flushed as it happens, and kept in memory for `slotune status`."""
from __future__ import annotations

import json
import logging
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Entry:
    t: float
    service: str
    tuner: str
    setting: str
    old: float | None
    new: float | None
    reason: str
    outcome: str   # pushed | dry-run | held: ... | refused: ... | push failed: ... | kept | rolled back

    def line(self) -> str:
        return f"{self.service}.{self.setting}: {self.old} -> {self.new} ({self.outcome}) because {self.reason}"


class AuditLog:
    def __init__(self, path: str | Path | None, keep: int = 200):
        self.path = Path(path) if path else None
        self.recent: deque[Entry] = deque(maxlen=keep)
        if self.path:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self.file = self.path.open("a", buffering=1)
            except OSError as exc:
                raise OSError(f"cannot open the audit log {self.path}: {exc.strerror}; "
                              "set daemon.audit_log to a writable path") from None
        else:
            self.file = None

    def write(self, entry: Entry) -> None:
        self.recent.append(entry)
        log.info("decision %s", entry.line())
        if self.file:
            self.file.write(json.dumps(asdict(entry)) + "\n")

    def close(self) -> None:
        if self.file:
            self.file.close()
            self.file = None
