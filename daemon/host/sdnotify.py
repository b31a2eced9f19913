"""systemd's notify protocol (sd_notify) for Type=notify and the watchdog: one
datagram per state change to $NOTIFY_SOCKET. Every call does nothing and
returns False when the daemon was not started by systemd."""
from __future__ import annotations

import os
import socket
import time


def _address(env: str) -> str:
    if env.startswith("@"):
        return "\0" + env[1:]  # abstract namespace socket
    if env.startswith("/"):
        return env
    raise ValueError(f"NOTIFY_SOCKET={env!r} is neither a path nor an abstract socket (@name); "
                     "it is set by systemd for Type=notify units: unset it when running by hand")


def notify(message: str) -> bool:
    """Send one KEY=VALUE[\\nKEY=VALUE...] message; False when NOTIFY_SOCKET is unset."""
    env = os.environ.get("NOTIFY_SOCKET")
    if not env:
        return False
    address = _address(env)
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        try:
            sock.sendto(message.encode(), address)
        except OSError as exc:
            raise OSError(exc.errno, f"sd_notify to NOTIFY_SOCKET={env} failed: {exc.strerror}") from exc
    return True


def ready() -> bool:
    """Start-up is complete: probes attached, exporter listening."""
    return notify("READY=1")


def status(text: str) -> bool:
    """One line shown by `systemctl status slotune`."""
    return notify("STATUS=" + " ".join(text.split()))


def reloading() -> bool:
    """A SIGHUP reload began; send ready() when it is done (or refused)."""
    return notify(f"RELOADING=1\nMONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}")


def stopping() -> bool:
    return notify("STOPPING=1")


def watchdog_ping() -> bool:
    """Tell systemd the main loop is alive; call at about half of watchdog_interval()."""
    return notify("WATCHDOG=1")


def watchdog_interval() -> float | None:
    """WatchdogSec in seconds when systemd expects pings from this process, else None."""
    usec = os.environ.get("WATCHDOG_USEC")
    if not usec:
        return None
    pid = os.environ.get("WATCHDOG_PID")
    if pid and pid != str(os.getpid()):
        return None  # meant for another process (e.g. our parent)
    try:
        value = int(usec)
    except ValueError:
        value = 0
    if value <= 0:
        raise ValueError(f"WATCHDOG_USEC={usec!r} is not a positive number of microseconds "
                         "(systemd sets it from WatchdogSec=; unset it when running by hand)")
    return value / 1e6
