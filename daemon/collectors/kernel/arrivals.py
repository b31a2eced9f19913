"""New processes, caught as they exec: bpf/targeting.bpf.c sends the process id
of every program an unwatched task exec's to a ring buffer, and a thread hands
each one to the collector at once (KernelCollector.adopt), which watches it there
and then if it is a service's. So a service started after slotune is counted
from its first request, not from the rescan at the end of the interval it
started in; the rescan stays the safety net (a dropped event, a port finder)."""
from __future__ import annotations

import ctypes
import logging
import threading
from typing import Callable

from daemon.collectors.kernel.family import Attachment

log = logging.getLogger(__name__)

TRACEPOINTS = (("syscalls:sys_exit_execve", "on_execve_exit"),
               ("syscalls:sys_exit_execveat", "on_execveat_exit"))
POLL_MS = 100               # how often the thread looks at its stop flag


class Arrivals:
    """Attaches the exec probes and runs the thread that reads their ring buffer."""

    def __init__(self, program, adopt: Callable[[int], None]):
        self.program = program
        self.adopt = adopt
        self.stopping = threading.Event()
        self.failed = False
        for tp, fn in TRACEPOINTS:
            program.attach(Attachment("tracepoint", tp, fn))
        program.table("execs").open_ring_buffer(self._event)
        self.thread = threading.Thread(target=self._run, name="slotune-arrivals", daemon=True)
        self.thread.start()

    def _event(self, _ctx, data, _size) -> int:
        pid = ctypes.cast(data, ctypes.POINTER(ctypes.c_uint32)).contents.value
        try:
            self.adopt(pid)
        except Exception:
            if not self.failed:
                self.failed = True
                log.exception("kernel collector: watching a new process at its exec failed; the "
                              "rescan each interval finds it instead (said once)")
        return 0

    def _run(self) -> None:
        while not self.stopping.is_set():
            self.program.bpf.ring_buffer_poll(POLL_MS)

    def stop(self) -> None:
        """Ends the thread; the program may be closed after this returns."""
        self.stopping.set()
        self.thread.join()
