"""Pushes limits into a running HAProxy through its runtime API (the stats socket,
a Unix path or HOST:PORT, at level admin): `set maxconn server|frontend|global`
and `set rate-limit sessions|connections global`, one command per connection as
the socket's non-interactive mode has it. A push reads every value back (`show
stat` column slim, `show info` Maxconn / SessRateLimit / ConnRateLimit) and, on
any refusal or mismatch, sets back what it had changed: never half-applied. A read
that times out is tried again (READ_TRIES in all): on a saturated host HAProxy's
answer can be seconds late, and a set that landed is not a failed push. A set
whose answer never came may have landed, so it is set back like one that did.
Commands and answers: HAProxy 2.6 management guide, section 9.3 "Unix Socket
commands" (docs.haproxy.org/2.6/management.html; Debian's management.txt.gz);
HAProxy 2.6's `show servers state` has no maxconn column, so `show stat` it is."""
from __future__ import annotations

import csv
import math
import re
import socket
import time

from slotune.actuators import ActuatorError, Control, Option, Targets, read_back
from slotune.profiles.haproxy import FORMS, form
from slotune.profiles.haproxy import target_error as target_error

MAX_ANSWER_BYTES = 4 << 20
LARGEST = 2**31 - 1          # HAProxy's limits are signed 32-bit
READ_TRIES = 3               # reads of the values in force, each within timeout_s


KIND = "haproxy"
OPTIONS = {"address": Option("the stats socket (a Unix path or HOST:PORT, at level admin)", required=True)}
TARGETS = Targets('concurrency_limit = "maxconn server BACKEND/SERVER"', required=True)


def from_control(control: Control, owns=None) -> "HaproxyActuator":
    return HaproxyActuator(control.options["address"], control.targets)


class HaproxyActuator:
    """targets: setting -> the limit it is, in the runtime API's words ("maxconn server be/s1")."""

    def __init__(self, address: str, targets: dict[str, str], timeout_s: float = 2.0):
        self.address, self.targets, self.timeout_s = address, dict(targets), timeout_s

    def command(self, line: str) -> str:
        """HAProxy's whole answer to one command line, connecting to last byte within timeout_s."""
        family, where = (socket.AF_UNIX, self.address) if self.address.startswith("/") else \
            (socket.AF_INET6 if self.address.startswith("[") else socket.AF_INET, _host_port(self.address))
        deadline = time.monotonic() + self.timeout_s
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.settimeout(self.timeout_s)
                s.connect(where)
                _until(s, deadline).sendall(line.encode() + b"\n")
                chunks, size = [], 0
                while chunk := _until(s, deadline).recv(65536):
                    size += len(chunk)
                    if size > MAX_ANSWER_BYTES:
                        raise ActuatorError(f"HAProxy socket {self.address}: the answer to {line!r} is larger "
                                            f"than {MAX_ANSWER_BYTES} bytes", unreachable=False)
                    chunks.append(chunk)
        except TimeoutError:
            raise ActuatorError(f"HAProxy socket {self.address}: no complete answer to {line!r} "
                                f"within {self.timeout_s:g} s") from None
        except OSError as exc:
            raise ActuatorError(f"HAProxy socket {self.address}: {line!r}: {exc.strerror or exc}") from None
        return b"".join(chunks).decode(errors="replace")

    def current(self) -> dict[str, float]:
        return self._read(self.targets)

    def _read(self, settings) -> dict[str, float]:
        """The value in force of each of these settings, from one `show stat` and one `show info` at most."""
        forms = {s: form(self.targets[s]) for s in settings}
        stat = self._stat() if any(how == "stat" for _, how in forms.values()) else {}
        info = self._info() if any(how != "stat" for _, how in forms.values()) else {}
        out = {}
        for setting, (m, how) in forms.items():
            target = self.targets[setting]
            if how == "stat":
                row = (m["proxy"], m.groupdict().get("server") or "FRONTEND")
                if row not in stat:
                    raise ActuatorError(f"HAProxy socket {self.address}: `show stat` has no {'/'.join(row)} "
                                        f"(setting {setting} = {target!r}): check the name in haproxy.cfg",
                                        unreachable=False)
                text, whence = stat[row], f"`show stat` {'/'.join(row)} slim"
            else:
                if how not in info:
                    raise ActuatorError(f"HAProxy socket {self.address}: `show info` has no {how} line "
                                        f"(setting {setting} = {target!r})", unreachable=False)
                text, whence = info[how], f"`show info` {how}"
            if text == "":
                raise ActuatorError(f"HAProxy socket {self.address}: {whence} is empty: {target} has no limit in "
                                    f"haproxy.cfg; give it one (e.g. maxconn 64) for slotune to tune",
                                    unreachable=False)
            out[setting] = _number(text, f"HAProxy socket {self.address}: {whence}")
        return out

    def _read_patiently(self, settings) -> dict[str, float]:
        """_read(), tried again while HAProxy's answer is late (READ_TRIES in all); any other error at once."""
        for _ in range(READ_TRIES - 1):
            try:
                return self._read(settings)
            except ActuatorError as exc:
                if not exc.unreachable:
                    raise
        return self._read(settings)

    def _stat(self) -> dict[tuple[str, str], str]:
        """(proxy, server or FRONTEND/BACKEND) -> its slim (configured session limit) column."""
        answer = self.command("show stat")
        lines = answer.splitlines()
        if not lines or not lines[0].startswith("# pxname,svname,"):
            raise ActuatorError(f"HAProxy socket {self.address}: the answer to `show stat` is not its CSV "
                                f"(it starts {answer[:60]!r})", unreachable=False)
        try:
            rows = list(csv.reader(lines))
        except csv.Error as exc:      # e.g. a field over csv's 128 KiB limit
            raise ActuatorError(f"HAProxy socket {self.address}: the answer to `show stat` is not its CSV ({exc})",
                                unreachable=False) from None
        header = rows[0]
        header[0] = header[0].removeprefix("# ")
        if "slim" not in header:
            raise ActuatorError(f"HAProxy socket {self.address}: `show stat` has no slim column", unreachable=False)
        col = header.index("slim")
        return {(r[0], r[1]): r[col] for r in rows[1:] if len(r) > col}

    def _info(self) -> dict[str, str]:
        answer = self.command("show info")
        info = dict(line.split(": ", 1) for line in answer.splitlines() if ": " in line)
        if "Name" not in info:
            raise ActuatorError(f"HAProxy socket {self.address}: the answer to `show info` is not HAProxy's "
                                f"(it starts {answer[:60]!r})", unreachable=False)
        return info

    def push(self, changes: dict[str, float]) -> None:
        for setting, value in changes.items():
            if setting not in self.targets:
                raise ActuatorError(f"setting {setting} has no HAProxy limit: add it to [control.targets] "
                                    f"({FORMS}); nothing was set", unreachable=False)
            if not (math.isfinite(value) and float(value).is_integer() and 1 <= value <= LARGEST):
                raise ActuatorError(f"setting {setting} = {value:g}: HAProxy's {self.targets[setting]} takes a "
                                    f"whole number 1..{LARGEST} (0 means no limit); set integer = true and "
                                    f"min >= 1 in its [settings] table; nothing was set", unreachable=False)
        before = self._read(changes)
        done: list[str] = []
        try:
            for setting, value in changes.items():
                try:
                    self._set(setting, value)
                except ActuatorError as exc:
                    if exc.unreachable:     # its answer never came: it may have landed
                        done.append(setting)
                    raise
                done.append(setting)
            read_back(changes, self._read_patiently(changes), f"HAProxy socket {self.address}")
        except ActuatorError as exc:
            raise ActuatorError(f"{exc}; {self._restore(done, before)}", exc.unreachable) from None

    def _set(self, setting: str, value: float) -> None:
        line = f"set {self.targets[setting]} {int(value)}"
        answer = self.command(line)
        if answer.strip():
            raise ActuatorError(f"HAProxy socket {self.address} refused {line!r} (setting {setting}): "
                                f"{' '.join(answer.split())[:200]}", unreachable=False)

    def _restore(self, done: list[str], before: dict[str, float]) -> str:
        """Set back what this push had changed; says whether that landed."""
        if not done:
            return "nothing was set"
        try:
            for setting in done:
                self._set(setting, before[setting])
            read_back({s: before[s] for s in done}, self._read_patiently(done), f"HAProxy socket {self.address}")
        except ActuatorError as exc:
            return f"setting back {', '.join(done)} FAILED ({exc}): check them with `show stat`"
        return f"set back {', '.join(f'{s} = {before[s]:g}' for s in done)}"


def _until(s: socket.socket, deadline: float) -> socket.socket:
    """s, waiting no longer than what is left until the deadline; TimeoutError once it has passed
    (a socket that trickles would otherwise be read past it, up to the size cap)."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    s.settimeout(left)
    return s


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not port.isdigit():
        raise ActuatorError(f"HAProxy socket {address!r} is neither a Unix socket path (/...) nor HOST:PORT",
                            unreachable=False)
    return host.strip("[]") or "127.0.0.1", int(port)


def _number(text: str, where: str) -> float:
    if not re.fullmatch(r"[0-9]{1,10}", text.strip()):
        raise ActuatorError(f"{where} is {text[:40]!r}, not a whole number", unreachable=False)
    return float(text)
