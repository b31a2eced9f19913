"""The audit log: one JSON line per setting of a decision (what, old -> new, why,
outcome and its detail, and the decision it belongs to), written and fsynced
before the push it describes, and kept in memory for `slotune status`. The
lines of one decision go out in one write, whole or not at all (a write cut
short by a full disk is cut off again). If that push then fails, a line
with the same decision follows: the last line of a decision says what became
of it. SIGHUP reopens the file (logrotate: rotate, then `systemctl reload`;
copytruncate is safe too, as every write appends)."""
from __future__ import annotations

import errno
import itertools
import json
import logging
import os
import time
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
    RECOMMENDED = "recommended"         # a restart-only setting: said, for the operator to apply, not pushed
    HELD = "held"                       # not now: rolled back recently, or changed this interval
    REFUSED = "refused"                 # cannot: no bounds for the setting, or the tuner stopped
    PUSH_FAILED = "push failed"
    KEPT = "kept"                       # a pushed change judged and left in force
    ROLLED_BACK = "rolled back"
    ROLLBACK_FAILED = "rollback failed"
    ALERT_RAISED = "alert raised"
    ALERT_CLEARED = "alert cleared"
    RESTORED = "restored"               # put back at a clean stop (--restore-on-exit)

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
    decision: str = ""  # the lines of one pushed decision share it

    def line(self) -> str:
        outcome = f"{self.outcome}: {self.detail}" if self.detail else self.outcome
        return (f"{self.service}.{self.setting}: {shown(self.old)} -> {shown(self.new)} ({outcome}) "
                f"because {self.reason}")


def shown(value: float | None) -> str:
    """A setting's value as a person reads it: 64, not 64.0; 0.3, not 0.30000000000000004
    (the audit log's JSON keeps the exact value)."""
    if value is None:
        return "none"
    if float(value).is_integer():
        return str(int(value))
    return f"{value:.4g}" if abs(value) < 1e4 else f"{value:.0f}"


class AuditError(OSError):
    """The audit log cannot be written: what it would have recorded must not happen."""


class AuditLog:
    def __init__(self, path: str | Path | None, keep: int = 200):
        self.path = Path(path) if path else None
        self.recent: deque[Entry] = deque(maxlen=keep)
        self.fd: int | None = None
        self._decisions = itertools.count(1)
        self._run = f"{os.getpid()}.{int(time.time())}"
        self.open()

    def open(self) -> None:
        """(Re)open the file for appending; a start-up failure names the key to fix."""
        if not self.path:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640)
        except OSError as exc:
            raise OSError(f"cannot open the audit log {self.path}: {exc.strerror}; "
                          "set daemon.audit_log to a writable path") from None
        old, self.fd = self.fd, fd
        if old is not None:
            os.close(old)

    def reopen(self) -> None:
        """After a rotation (SIGHUP): the path may now name a new file. Keeps the old one on failure."""
        try:
            self.open()
        except OSError as exc:
            log.error("%s; still writing to the file opened before", exc)

    def new_decision(self) -> str:
        return f"{self._run}.{next(self._decisions)}"

    def write_all(self, entries: list[Entry]) -> None:
        """Append the entries whole or not at all: one write, fsynced; AuditError when that fails."""
        if self.fd is not None and entries:
            self._append_whole(self.fd, "".join(json.dumps(asdict(e)) + "\n" for e in entries).encode())
        for e in entries:
            self.recent.append(e)
            log.info("decision %s", e.line())

    def _append_whole(self, fd: int, data: bytes) -> None:
        """One write and an fsync; on a short write (disk full, file-size limit) or a failed fsync
        the bytes it wrote are cut off again, so no reader ever sees part of a line."""
        written = 0
        try:
            written = os.write(fd, data)
            if written != len(data):
                raise OSError(errno.ENOSPC, f"short write ({written} of {len(data)} bytes)")
            os.fsync(fd)
        except OSError as exc:
            left = self._take_back(fd, written)
            raise AuditError(f"audit log {self.path} cannot be written ({exc.strerror or exc}){left}; "
                             "free space there or set daemon.audit_log to a writable path") from None

    def _take_back(self, fd: int, written: int) -> str:
        """Cut the last `written` bytes (this write's, appended at the end); what is left, in words."""
        if not written:
            return ""
        try:
            os.ftruncate(fd, os.fstat(fd).st_size - written)
            return ""
        except OSError as exc:
            return f" and the {written} bytes written could not be cut off again ({exc.strerror})"

    def write(self, entry: Entry) -> None:
        self.write_all([entry])

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
