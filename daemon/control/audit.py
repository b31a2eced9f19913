"""The audit log: one JSON line per decision (what, old -> new, why, outcome and
its detail), appended and flushed as it happens, and kept in memory for `slotune status`."""
from __future__ import annotations

import json
import logging
from collections import deque
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path

log = logging.getLogger(__name__)


class Outcome(StrEnum):
    """What became of one decision. The value is what the audit log's "outcome" holds
    (the words it held before there was an enum, so its readers match them as they did);
    `label` is the value of the metric label."""
    PUSHED = "pushed"
    DRY_RUN = "dry-run"
    HELD = "held"                       # not now: rolled back recently, or changed this interval
    REFUSED = "refused"                 # cannot: no bounds for the setting, or the tuner stopped
    PUSH_FAILED = "push failed"
    KEPT = "kept"                       # a pushed change judged and left in force
    ROLLED_BACK = "rolled back"
    ROLLBACK_FAILED = "rollback failed"
    ALERT_RAISED = "alert raised"
    ALERT_CLEARED = "alert cleared"

    @property
    def label(self) -> str:
        return self.name.lower()


@dataclass(frozen=True)
class Entry:
    t: float
    service: str
    tuner: str
    setting: str
    old: float | None
    new: float | None
    reason: str
    outcome: Outcome
    detail: str = ""   # why it came to that outcome: "rolled back recently", the push's error, ...

    def line(self) -> str:
        outcome = f"{self.outcome}: {self.detail}" if self.detail else self.outcome
        return f"{self.service}.{self.setting}: {self.old} -> {self.new} ({outcome}) because {self.reason}"


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
