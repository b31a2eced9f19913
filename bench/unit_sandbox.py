"""The shipped unit's sandbox without systemd (these machines run none as PID 1):
a command prefix that gives what follows the unit's capability bounding set and
NoNewPrivileges= (setpriv), and its file-system view (ProtectSystem=strict with
its ReadWritePaths=, ProtectKernelTunables='s /proc/kallsyms; unshare + mount),
all read from systemd/slotune.service itself so that they follow the unit.
Used by the unit's tests and by bench/chaos.py."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

UNIT = Path(__file__).resolve().parents[1] / "systemd" / "slotune.service"

# What the unit does to the file system (systemd's namespace.c). ProtectSystem=strict: every mount
# read-only but /dev and /proc; ReadWritePaths= (the first argument, space-separated) each bound onto
# itself and left writable. ProtectKernelTunables=: /proc/kallsyms inaccessible, /sys and every mount
# under it (tracefs, /sys/fs/bpf) read-only. Not PrivateTmp= or ProtectHome=: a test's files are in /tmp.
UNIT_VIEW = """set -e
mount --make-rprivate /
writable=$1; shift
for p in $writable; do mount --bind "$p" "$p"; done
for m in $(awk '{print $2}' /proc/self/mounts | sort -u); do
  case "$m" in /proc|/proc/*|/dev|/dev/*) continue;; esac
  case " $writable " in *" $m "*) continue;; esac
  mount -o remount,bind,ro "$m"
done
mount --bind /dev/null /proc/kallsyms
exec "$@"
"""


def unit_values(key: str) -> list[str]:
    """Every word given to `key=` in the unit, over all its lines."""
    words = []
    for line in UNIT.read_text().splitlines():
        if line.startswith(key + "="):
            words += line.split("=", 1)[1].split()
    return words


def unit_section(name: str) -> dict[str, str]:
    """key -> value of one [section] of the unit (the last value of a repeated key)."""
    out, current = {}, None
    for line in UNIT.read_text().splitlines():
        if line.startswith("["):
            current = line.strip()[1:-1]
        elif current == name and "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            out[key.strip()] = value.strip()
    return out


def unit_view(*writable_too) -> list[str]:
    """A command prefix: what follows runs in the unit's file system view, with the unit's
    ReadWritePaths= that exist here (StateDirectory= makes its own) writable, and writable_too
    (a drop-in's ReadWritePaths=, the folder a test or bench writes to)."""
    writable = [p for p in unit_values("ReadWritePaths") if os.path.isdir(p)] + [str(p) for p in writable_too]
    return ["unshare", "--mount", "sh", "-c", UNIT_VIEW, "sh", " ".join(writable)]


def unit_privileges(without: str = "") -> list[str]:
    """A command prefix: what follows runs as the unit runs it, root with only the unit's
    CapabilityBoundingSet= (less `without`, a CAP_ name) and NoNewPrivileges=. Capabilities this
    machine withholds from its root are left out (this VM withholds CAP_SYS_RESOURCE)."""
    assert unit_section("Service").get("NoNewPrivileges") == "yes"
    bounding = int(next(line.split()[1] for line in open("/proc/self/status") if line.startswith("CapBnd:")), 16)
    names = subprocess.run(["setpriv", "--list-caps"], capture_output=True, text=True).stdout.split()  # by number
    here = {name for bit, name in enumerate(names) if bounding >> bit & 1}
    caps = ",".join("+" + c[4:].lower() for c in unit_values("CapabilityBoundingSet")
                    if c[4:].lower() in here and c != without)
    return ["setpriv", f"--bounding-set=-all,{caps}", "--no-new-privs"]


def sandboxed(command: list[str], *writable_too) -> list[str]:
    """command as the unit runs it: its view of the file system, its privileges."""
    return unit_view(*writable_too) + unit_privileges() + command
