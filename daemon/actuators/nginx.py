"""Pushes limits into nginx through one include file slotune owns: each setting
is one directive line written from its target (`limit_conn perserver {}` ->
`limit_conn perserver 8;`), only its number changed, every other byte kept. A
push replaces the file atomically (safe_files: no link followed, mode and owner
kept, fsync), validates with `nginx -t -c CONF`, reloads with `nginx -s reload
-c CONF`, and with pid_file checks the master started a worker after the reload
was sent (the reload took; a worker forked at nginx's start-up does not count);
if any step fails the previous file is put back byte for byte.
Directives: nginx docs, ngx_http_limit_conn_module (limit_conn), ngx_http_limit_req_module
(limit_req_zone rate=Nr/s, limit_req burst=N), ngx_http_upstream_module (server ... max_conns=N);
command line: nginx.org/en/docs/switches.html; reload: nginx.org/en/docs/control.html."""
from __future__ import annotations

import math
import os
import re
import subprocess
import time

from slotune.actuators import ActuatorError, Control, Option, Targets, plain, read_back
from slotune.host.proc_clock import CLOCK_TICKS, uptime_s
from slotune.host.safe_files import read_regular, replace_file
from slotune.profiles.nginx import target_error as target_error

INCLUDE_MAX_BYTES = 1 << 16
PID_FILE_MAX_BYTES = 64
NUMBER = r"([0-9]+(?:\.[0-9]+)?)"


def directive_line(target: str) -> re.Pattern:
    """The target's line in the include file: (indent and the text before the number, the number,
    the rest to the ;). Blanks are spaces and tabs only, so the search stays linear in the file's
    size (\\s* at a line's start would cross newlines: quadratic on a file of blank lines)."""
    before, after = target.split("{}")
    return re.compile(r"^([ \t]*" + re.escape(before) + ")" + NUMBER + "(" + re.escape(after) + r"[ \t]*;)", re.M)


KIND = "nginx"
OPTIONS = {"path": Option("the include file slotune owns", required=True),
           "conf": Option("the main nginx.conf that includes it", required=True),
           "binary": Option("the nginx executable that validates and reloads", default="/usr/sbin/nginx"),
           "pid_file": Option("nginx's pid file (else its master is found by its command line)")}
TARGETS = Targets('concurrency_limit = "limit_conn perserver {}"', required=True)


def from_control(control: Control, owns=None) -> "NginxActuator":
    o = control.options
    return NginxActuator(o["path"], o["conf"], control.targets, o["binary"], o["pid_file"])


class NginxActuator:
    def __init__(self, path: str, conf: str, targets: dict[str, str], binary: str = "/usr/sbin/nginx",
                 pid_file: str = "", timeout_s: float = 10.0):
        self.path, self.conf, self.binary, self.pid_file = path, conf, binary, pid_file
        self.targets, self.timeout_s = dict(targets), timeout_s
        self.lines = {s: directive_line(t) for s, t in targets.items()}

    def _read(self) -> tuple[bytes, str, os.stat_result]:
        """The include file's bytes, as text, and its status."""
        try:
            data, st = read_regular(self.path, "nginx include file", INCLUDE_MAX_BYTES)
        except FileNotFoundError:
            raise ActuatorError(f"nginx include file {self.path} does not exist: write it with a line per setting "
                                f"({self._example()}) and include it from {self.conf}", unreachable=False) from None
        try:
            return data, data.decode("utf-8"), st
        except UnicodeDecodeError as exc:
            raise ActuatorError(f"nginx include file {self.path} is not UTF-8 text (byte {exc.start})",
                                unreachable=False) from None

    def _values(self, text: str) -> dict[str, float]:
        out = {}
        for setting, rx in self.lines.items():
            found = rx.findall(text)
            if len(found) != 1:
                raise ActuatorError(f"nginx include file {self.path} has {len(found)} lines "
                                    f"`{self.targets[setting].replace('{}', 'N')};` for setting {setting}; "
                                    "it needs exactly one", unreachable=False)
            value = float(found[0][1])
            if not math.isfinite(value):
                raise ActuatorError(f"nginx include file {self.path}: setting {setting}'s number "
                                    f"({found[0][1][:20]}...) is too large for a limit", unreachable=False)
            out[setting] = value
        return out

    def current(self) -> dict[str, float]:
        return self._values(self._read()[1])

    def push(self, changes: dict[str, float]) -> None:
        unknown = [s for s in changes if s not in self.targets]
        if unknown:
            raise ActuatorError(f"setting {unknown[0]} has no nginx directive: add it to [control.targets] "
                                f"({self._example()}); nothing was written", unreachable=False)
        old, text, st = self._read()
        self._values(text)        # every setting's line is there, once
        for setting, value in changes.items():
            if value < 0:
                raise ActuatorError(f"setting {setting} = {value:g}: nginx takes no negative value here; "
                                    "nothing was written", unreachable=False)
            text = self.lines[setting].sub(lambda m, v=value: f"{m[1]}{plain(v)}{m[3]}", text)   # type: ignore[misc]
        master = self._master()
        replace_file(self.path, text.encode(), st, "nginx include file")
        reloading = False
        try:
            self._nginx("-t", "rejected the new include file (nothing was reloaded)")
            reloading = True
            sent = _boot_ticks()
            self._nginx("-s", "reload", "did not reload")
            self._took(master, sent)
            read_back(changes, self.current(), f"nginx include file {self.path}")
        except ActuatorError as exc:
            raise ActuatorError(f"{exc}; {self._restore(old, st, reloading)}", exc.unreachable) from None

    def _nginx(self, *args: str) -> None:
        *flags, why = args
        command = [self.binary, *flags, "-c", self.conf]
        try:
            done = subprocess.run(command, capture_output=True, timeout=self.timeout_s, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise ActuatorError(f"`{' '.join(command)}` took over {self.timeout_s:g} s") from None
        except OSError as exc:
            raise ActuatorError(f"cannot run {self.binary}: {exc.strerror}; set [control] binary to nginx's "
                                "executable", unreachable=False) from None
        if done.returncode != 0:
            said = " ".join(done.stderr.decode(errors="replace").split())[-300:]
            raise ActuatorError(f"`{' '.join(command)}` {why}: {said}", unreachable=False)

    def _master(self) -> int | None:
        """The master's pid; None without a pid file (nothing to check the reload against)."""
        if not self.pid_file:
            return None
        try:
            data, _ = read_regular(self.pid_file, "nginx pid file", PID_FILE_MAX_BYTES)
        except FileNotFoundError:
            raise ActuatorError(f"nginx pid file {self.pid_file} does not exist (is nginx running?); "
                                "nothing was written") from None
        if not re.fullmatch(rb"\s*[0-9]{1,10}\s*", data) or int(data) <= 1:
            raise ActuatorError(f"nginx pid file {self.pid_file} does not hold a master's pid (it starts "
                                f"{data[:20]!r}); nothing was written", unreachable=False)
        return int(data)

    def _took(self, master: int | None, sent: int) -> None:
        """With a pid file: the reload took when the master has a worker that started at or after
        `sent` (clock ticks since boot). Comparing worker pids before and after would take a
        worker nginx forks at its own start-up for the reload's."""
        if master is None:
            return
        deadline = time.monotonic() + self.timeout_s
        while not any(start >= sent for start in workers(master).values()):
            if time.monotonic() > deadline:
                raise ActuatorError(f"nginx (master {master}) started no new workers within "
                                    f"{self.timeout_s:g} s of the reload: the new config did not take "
                                    "(its error log says why)", unreachable=False)
            time.sleep(0.05)

    def _restore(self, old: bytes, st, reload: bool) -> str:
        """Put the previous file back (and reload it when the new one may have reached nginx)."""
        try:
            replace_file(self.path, old, st, "nginx include file")
            if reload:
                self._nginx("-s", "reload", "did not reload")
        except ActuatorError as exc:
            return f"putting back the previous include file FAILED ({exc})"
        return "the previous include file is back" + (" and reloaded" if reload else "")

    def _example(self) -> str:
        return ", ".join(f"`{t.replace('{}', 'N')};`" for t in self.targets.values()) or "`limit_conn perserver 8;`"


def workers(master: int) -> dict[int, int]:
    """The master's child processes: pid -> start time in clock ticks since boot (proc(5) stat
    fields 4 and 22)."""
    found = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    fields = f.read().rpartition(b")")[2].split()
                if int(fields[1]) == master:
                    found[int(name)] = int(fields[19])
            except (OSError, ValueError, IndexError):
                continue
    return found


def _boot_ticks() -> int:
    """Now, in the clock ticks /proc/PID/stat counts start times in (/proc/uptime's
    centiseconds: whole ticks at USER_HZ 100, rounded off the float product)."""
    return round(uptime_s() * CLOCK_TICKS)
