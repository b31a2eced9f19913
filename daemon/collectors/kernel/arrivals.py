"""New processes, caught as they exec: bpf/targeting.bpf.c sends the process id
of every program an unwatched task exec's to a ring buffer, and a thread hands
each one to the collector at once (KernelCollector.adopt), which watches it there
and then if it is a service's. So a service started after slotune is counted
from its first request, not from the rescan at the end of the interval it
started in; the rescan stays the safety net (a dropped event, a port finder). The
thread sleeps until an exec is sent or stop() wakes it: an idle host costs it nothing."""
from __future__ import annotations

import ctypes
import logging
import os
import select
import threading
from typing import Callable

from slotune.collectors.kernel.family import Attachment

log = logging.getLogger(__name__)

# Raw: no trace record, and no program on any syscall. The exec family counts a
# watched task's execs in the same program (bpf/targeting.bpf.c).
EXEC = ("sched:sched_process_exec", "on_process_exec")


def ring_buffer_fd(bpf) -> int:
    """The fd a poll on bpf's ring buffers waits on: libbpf's, inside libbcc (BCC's Python has
    no call for it; imported here, as the daemon's modules import without BCC)."""
    from bcc.libbcc import lib
    lib.ring_buffer__epoll_fd.restype = ctypes.c_int
    lib.ring_buffer__epoll_fd.argtypes = [ctypes.c_void_p]
    return lib.ring_buffer__epoll_fd(bpf._ringbuf_manager)


class Arrivals:
    """Attaches the exec probes and runs the thread that reads their ring buffer."""

    def __init__(self, program, adopt: Callable[[int], None]):
        self.program = program
        self.adopt = adopt
        self.failed = False
        program.attach(Attachment("raw_tracepoint", *EXEC))
        program.table("execs").open_ring_buffer(self._event)
        self.wake_read, self.wake_write = os.pipe()     # stop() writes here
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
        waits = select.poll()
        waits.register(ring_buffer_fd(self.program.bpf), select.POLLIN)
        waits.register(self.wake_read, select.POLLIN)
        while all(fd != self.wake_read for fd, _ in waits.poll()):
            self.program.bpf.ring_buffer_consume()

    def stop(self) -> None:
        """Ends the thread; the program may be closed after this returns."""
        os.write(self.wake_write, b"x")
        self.thread.join()
        os.close(self.wake_read)
        os.close(self.wake_write)
