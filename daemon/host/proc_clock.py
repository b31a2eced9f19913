"""The clock of a process's start time in /proc/<pid>/stat: clock ticks since boot."""
from __future__ import annotations

import os

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def uptime_s() -> float:
    """Seconds since boot, the clock of a process's start time in /proc/<pid>/stat."""
    with open("/proc/uptime") as f:
        return float(f.read().split()[0])
