"""HTTP/1.x request latency per service from accept/read/write/close (bpf/http.bpf.c)."""
from daemon.collectors.kernel.family import Family, Signal

_CALLS = (("exit", "accept"), ("exit", "accept4"),
          ("enter", "read"), ("enter", "readv"), ("enter", "recvfrom"), ("enter", "recvmsg"),
          ("exit", "read"), ("exit", "readv"), ("exit", "recvfrom"), ("exit", "recvmsg"),
          ("enter", "write"), ("enter", "writev"), ("enter", "sendto"), ("enter", "sendmsg"),
          ("enter", "close"))


class Http(Family):
    name = source = "http"
    signals = (Signal("http_request", "slotune_http_request_duration_seconds", None, "histogram",
                      "HTTP/1.x request latency seen from the kernel: first read to response write"),)
    tracepoints = tuple((f"syscalls:sys_{when}_{call}", f"on_{call}_{when}") for when, call in _CALLS) + (
        ("syscalls:sys_enter_sendfile64", "on_sendfile_enter"),)
