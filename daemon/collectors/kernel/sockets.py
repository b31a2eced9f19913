"""Where the http and tls families see a watched task's socket reads and writes
(bpf/common.h SOCK_PROGRAMS). On Linux >= 6.4 with BTF, the socket layer's
tracepoints: sock:sock_recv_length and sock:sock_send_length fire inside the
syscall that moves the bytes, tcp:tcp_destroy_sock at a TCP socket's end;
attached raw, they build no trace record, and unlike the syscall tracepoints
they send no task on the host down the kernel's slow syscall path. Which socket
is TCP is read at struct sock's sk_protocol, placed by the running kernel's BTF.
Elsewhere, the socket syscalls' exits and close()'s entry, keyed by (process,
fd): the same signals at the cost every syscall tracepoint puts on the whole
host, said in one line at start-up."""
from __future__ import annotations

import functools
import logging
import os
import platform

from slotune.collectors.kernel.btf import BtfError, offsets
from slotune.collectors.kernel.family import Points
from slotune.collectors.kernel.helpers import release

log = logging.getLogger(__name__)

PROTOCOL = ("sock", "sk_protocol")
POINTS: Points = (("sock:sock_recv_length", "on_sock_recv"),
          ("sock:sock_send_length", "on_sock_send"),
          ("tcp:tcp_destroy_sock", "on_sock_destroy"))
SYSCALL_POINTS = tuple((f"syscalls:sys_exit_{call}", f"on_{call}_exit")
                       for call in ("read", "readv", "recvfrom", "recvmsg", "write", "writev", "sendto",
                                    "sendmsg", "sendfile64")) + (("syscalls:sys_enter_close", "on_close_enter"),)
EVENTS = "/sys/kernel/tracing/events"
SINCE = (6, 4)           # the release that added sock_recv_length and sock_send_length


def tracepoints_present() -> bool:
    """The kernel has the socket tracepoints: asked of tracefs where it is mounted."""
    if os.path.isdir(EVENTS):
        return all(os.path.isdir(f"{EVENTS}/{tp.replace(':', '/')}") for tp, _ in POINTS)
    return release() >= SINCE


def protocol_offset() -> tuple[int, str]:
    """(struct sock's sk_protocol offset, "") where the socket layer can be read, else (-1, why not)."""
    if not tracepoints_present():
        return -1, (f"this kernel ({platform.release()}) has no sock:sock_recv_length or sock_send_length "
                    f"tracepoint (Linux >= {SINCE[0]}.{SINCE[1]})")
    try:
        return offsets((PROTOCOL,))[PROTOCOL], ""
    except BtfError as exc:
        return -1, str(exc)


FALLBACK = ("they read the socket syscalls' exits instead, which puts every task on the host on the kernel's "
            "slower syscall path while they run")
FIX = f"Linux >= {SINCE[0]}.{SINCE[1]} with BTF"


@functools.cache
def layout() -> dict[str, int]:
    """The #defines bpf/common.h builds the socket programs with: SOCK_LAYER 1 on
    the socket layer (with SOCK_PROTOCOL_OFF), 0 on the syscalls."""
    offset, why = protocol_offset()
    if offset >= 0:
        return {"SOCK_LAYER": 1, "SOCK_PROTOCOL_OFF": offset}
    log.warning("http and tls probes: %s; %s (fix: %s)", why, FALLBACK, FIX)
    return {"SOCK_LAYER": 0}


def points() -> tuple[tuple[str, str], ...]:
    """The raw tracepoints the http and tls programs attach to (none before 6.4)."""
    return POINTS if layout()["SOCK_LAYER"] else ()


def syscall_points() -> tuple[tuple[str, str], ...]:
    """The syscall tracepoints they attach to instead (none from 6.4)."""
    return () if layout()["SOCK_LAYER"] else SYSCALL_POINTS
