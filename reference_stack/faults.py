"""The blocking-I/O fault: real blocking syscalls on the event-loop thread.

For blocking_io_ms = N the request path writes 4 KiB to a scratch file and
fsync()s it (write + fsync: a disk flush), then sleeps out the rest of the N ms
in time.sleep (clock_nanosleep). Every other request on that process waits
behind it, as with a synchronous client library called from async code. The
syscalls show in syscall tracepoints (sys_enter/exit_write, _fsync,
_clock_nanosleep) as off-CPU time of the service's main thread.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

_BLOCK = b"\0" * 4096


def block_for(ms: float, scratch: Path) -> None:
    if ms <= 0:
        return
    end = time.monotonic() + ms / 1000.0
    fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, _BLOCK)
        os.fsync(fd)
    finally:
        os.close(fd)
    left = end - time.monotonic()
    if left > 0:
        time.sleep(left)
