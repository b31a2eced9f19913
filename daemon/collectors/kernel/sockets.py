"""The socket layer's tracepoints, where the http and tls families see a watched
task's reads and writes (bpf/common.h sock_io_of): sock:sock_recv_length and
sock:sock_send_length fire inside the syscall that moves the bytes (Linux >= 6.4),
and tcp:tcp_destroy_sock at a TCP socket's end. Attached raw, they build no trace
record, and unlike the syscall tracepoints they send no task on the host down the
kernel's slow syscall path. Which socket is TCP is read at struct sock's
sk_protocol, placed by the running kernel's BTF. Where either is missing those
programs are not attached, said in one line."""
from __future__ import annotations

import functools
import logging
import os
import platform

from daemon.collectors.kernel.btf import BtfError, offsets
from daemon.collectors.kernel.helpers import release

log = logging.getLogger(__name__)

PROTOCOL = ("sock", "sk_protocol")
POINTS = (("sock:sock_recv_length", "on_sock_recv"),
          ("sock:sock_send_length", "on_sock_send"),
          ("tcp:tcp_destroy_sock", "on_sock_destroy"))
EVENTS = "/sys/kernel/tracing/events"
SINCE = (6, 4)           # the release that added sock_recv_length and sock_send_length


def tracepoints_present() -> bool:
    """The kernel has the socket tracepoints: asked of tracefs where it is mounted."""
    if os.path.isdir(EVENTS):
        return all(os.path.isdir(f"{EVENTS}/{tp.replace(':', '/')}") for tp, _ in POINTS)
    return release() >= SINCE


@functools.cache
def layout() -> dict[str, int]:
    """The #define bpf/common.h reads a socket's protocol with (-1: the programs stay off)."""
    why = ""
    if not tracepoints_present():
        why = (f"this kernel ({platform.release()}) has no sock:sock_recv_length or sock_send_length "
               f"tracepoint (Linux >= {SINCE[0]}.{SINCE[1]})")
    else:
        try:
            return {"SOCK_PROTOCOL_OFF": offsets((PROTOCOL,))[PROTOCOL]}
        except BtfError as exc:
            why = str(exc)
    log.warning("http and tls probes: %s; the socket tracepoints are not attached, so no HTTP timing "
                "and no TLS handshakes (libssl's calls and bytes go on); fix: boot Linux >= %d.%d "
                "built with CONFIG_DEBUG_INFO_BTF", why, *SINCE)
    return {"SOCK_PROTOCOL_OFF": -1}


def points() -> tuple[tuple[str, str], ...]:
    """The raw tracepoints the http and tls families attach, or none where they cannot work."""
    return POINTS if layout()["SOCK_PROTOCOL_OFF"] >= 0 else ()
