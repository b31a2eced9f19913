"""What the guards remember of a service between decisions, and across a restart:
changes waiting to be judged (and rollbacks still owed), holds after a rollback,
when each setting last changed, and the values in force before slotune first
changed them (for --restore-on-exit). Saved to one JSON file after each tick; a
file that cannot be read at start is moved aside and the guards start empty."""
from __future__ import annotations

import json
import logging
import math
import os
import tempfile
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from slotune.host.safe_files import set_aside
from slotune.host.untrusted import json_value

log = logging.getLogger(__name__)
VERSION = 1
STATE_MAX_BYTES = 16 << 20     # a few hundred bytes a setting: far beyond any host's services
# A field's annotation (a string, under `from __future__ import annotations`) -> what the file may hold there.
KINDS: dict[str, type | tuple[type, ...]] = {"str": str, "float": (int, float), "bool": bool}


@dataclass
class Pending:
    """A pushed change waiting to be judged against the windows before it."""
    tuner: str
    setting: str
    old: float
    new: float
    t: float
    interval_s: float
    before_p99: float
    before_load: float
    rollback: bool = False    # judged worse: the old value is owed until a push of it lands
    why: str = ""

    @classmethod
    def from_dict(cls, d: dict) -> "Pending":
        """TypeError for a field of the wrong kind (it would fail each judgement instead)."""
        p = cls(**d)
        wrong = [f.name for f in fields(cls) if not isinstance(getattr(p, f.name), KINDS.get(str(f.type), object))]
        if wrong:
            raise TypeError(f"pending change {d!r}: {', '.join(wrong)} of the wrong kind")
        return p


@dataclass
class GuardState:
    pending: list[Pending] = field(default_factory=list)
    held_until: dict[str, float] = field(default_factory=dict)
    rollbacks: dict[str, int] = field(default_factory=dict)
    last_change: dict[str, float] = field(default_factory=dict)
    originals: dict[str, float] = field(default_factory=dict)

    @property
    def rollbacks_owed(self) -> bool:
        return any(p.rollback for p in self.pending)

    def remember_originals(self, settings: dict[str, float], tuned) -> None:
        """The first value read of each tuned setting is what a restore puts back."""
        for name in tuned:
            if name in settings and name not in self.originals:
                self.originals[name] = settings[name]

    def changed(self, entry, now: float, interval_s: float, before_p99: float, before_load: float) -> None:
        self.last_change[entry.setting] = now
        if entry.old is not None and math.isfinite(before_p99):
            self.pending.append(Pending(entry.tuner, entry.setting, entry.old, entry.new, now, interval_s,
                                        before_p99, before_load))

    def rolled_back(self, p: Pending, now: float, hold_intervals: float, max_hold_s: float) -> None:
        """Hold the setting: hold_intervals of its tuner, doubling with each rollback."""
        self.last_change[p.setting] = now
        self.rollbacks[p.setting] = self.rollbacks.get(p.setting, 0) + 1
        hold = hold_intervals * p.interval_s * 2 ** (self.rollbacks[p.setting] - 1)
        self.held_until[p.setting] = now + min(hold, max_hold_s)

    @classmethod
    def from_dict(cls, d: dict) -> "GuardState":
        return cls(pending=[Pending.from_dict(p) for p in d.get("pending", [])],
                   **{k: {s: float(v) for s, v in d.get(k, {}).items()}
                      for k in ("held_until", "last_change", "originals")},
                   rollbacks={s: int(v) for s, v in d.get("rollbacks", {}).items()})


class GuardFile:
    """The guards of every service in one JSON file, replaced atomically."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.written: str | None = None     # the body this process last wrote there

    def load(self) -> dict[str, GuardState]:
        """What the last run left; {} for a first start. A file that cannot be read is said
        once and moved aside (<name>.corrupt-<time>), never fatal: the guards then start empty."""
        try:
            raw = json_value(self.path.read_bytes(), self.path.name, max_bytes=STATE_MAX_BYTES)
            if raw.get("version") != VERSION:
                raise ValueError(f"version {raw.get('version')!r}, this slotune writes {VERSION}")
            return {name: GuardState.from_dict(d) for name, d in raw["services"].items()}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, KeyError, TypeError, AttributeError, OverflowError) as exc:
            self._set_aside(exc)
            return {}

    def _set_aside(self, exc: Exception) -> None:
        try:
            aside = set_aside(self.path)
        except OSError as move:
            aside = f"nowhere (it could not be moved: {move.strerror}; the next save replaces it)"
        log.error("guard state %s unreadable (%s): moved aside to %s, the guards start empty",
                  self.path, exc, aside)

    def save(self, guards: dict[str, GuardState]) -> None:
        """Write, fsync, rename, fsync the folder; raises OSError (the caller counts it).
        Guards the same as last written are not written again (most ticks change none)."""
        body = json.dumps({"version": VERSION, "services": {n: asdict(g) for n, g in guards.items()}})
        if body == self.written:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(body)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        folder = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
        self.written = body
