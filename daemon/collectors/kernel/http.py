"""HTTP/1.x request latency per service from accept/read/write/close (bpf/http.bpf.c)."""
from daemon.collectors.kernel.family import Family, Signal


def syscall_points(*calls: tuple[str, str]) -> tuple[tuple[str, str], ...]:
    """(when, call) pairs as (tracepoint, fn): ("enter", "read") -> sys_enter_read, on_read_enter."""
    return tuple((f"syscalls:sys_{when}_{call}", f"on_{call}_{when}") for when, call in calls)


# The socket syscalls the tls family reads too: one program on each serves both (bpf/http.bpf.c).
SOCKET_CALLS = syscall_points(
    ("exit", "accept"), ("exit", "accept4"),
    ("enter", "read"), ("enter", "readv"), ("enter", "recvfrom"), ("enter", "recvmsg"),
    ("exit", "read"), ("exit", "readv"), ("exit", "recvfrom"), ("exit", "recvmsg"),
    ("enter", "write"), ("enter", "writev"), ("enter", "sendto"), ("enter", "sendmsg"),
    ("enter", "close"))


class Http(Family):
    name = source = "http"
    signals = (Signal("http_request", "slotune_http_request_duration_seconds", None, "histogram",
                      "HTTP/1.x request latency seen from the kernel: first read to response write"),)
    tracepoints = SOCKET_CALLS + (("syscalls:sys_enter_sendfile64", "on_sendfile_enter"),)
    defines = {"FAMILY_HTTP": 1}
