"""HTTP/1.x request latency per service from accept/read/write/close (bpf/http.bpf.c)."""
from daemon.collectors.kernel.program import Family

_CALLS = (("exit", "accept"), ("exit", "accept4"),
          ("enter", "read"), ("enter", "readv"), ("enter", "recvfrom"), ("enter", "recvmsg"),
          ("exit", "read"), ("exit", "readv"), ("exit", "recvfrom"), ("exit", "recvmsg"),
          ("enter", "write"), ("enter", "writev"), ("enter", "sendto"), ("enter", "sendmsg"),
          ("enter", "close"))


class Http(Family):
    name = source = "http"
    signals = ("http_request",)
    tracepoints = tuple((f"syscalls:sys_{when}_{call}", f"on_{call}_{when}") for when, call in _CALLS) + (
        ("syscalls:sys_enter_sendfile64", "on_sendfile_enter"),)
