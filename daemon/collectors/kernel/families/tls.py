"""TLS per service (bpf/tls.bpf.c): handshakes timed from the TLS records on the
services' sockets (sockets.py), whatever TLS stack they use; plaintext calls and
bytes from uprobes on libssl. The library is found in the services' own memory maps each
interval and each new one is probed once; the kernel side counts only watched
tasks. The handshake has one source, the records: libssl's SSL_do_handshake is
not probed, because it misses handshakes driven from SSL_read (openssl s_server
-www) and would count the others a second time."""
from __future__ import annotations

import os

from slotune.collectors.kernel import sockets
from slotune.collectors.kernel.family import Attachment, Family, Map, Signal
from slotune.collectors.kernel.helpers import PT_REGS
from slotune.model.signals import TLS_HANDSHAKE

DIRECTIONS = ("read", "write")           # TLS_READ = 0, TLS_WRITE = 1
ENTRY = {"SSL_read": "on_ssl_read", "SSL_write": "on_ssl_write",
         "SSL_read_ex": "on_ssl_read_ex", "SSL_write_ex": "on_ssl_write_ex"}
RETURN = "on_ssl_call_return"


def libssl_paths(pid: int) -> set[str]:
    """libssl files mapped by a process, as paths this process can open (through
    /proc/<pid>/root so containers work), or nothing if it is gone."""
    found = set()
    try:
        with open(f"/proc/{pid}/maps") as maps:
            for line in maps:
                path = line.rstrip("\n").split(None, 5)[-1] if line.count(" ") >= 5 else ""
                if "/libssl.so" in path and path.startswith("/"):
                    found.add(path)
    except OSError:
        return set()
    root = os.readlink(f"/proc/{pid}/root") if os.path.exists(f"/proc/{pid}/root") else "/"
    return {path if root == "/" else f"/proc/{pid}/root{path}" for path in found}


class Tls(Family):
    name = source = "tls"
    signals = (Signal(TLS_HANDSHAKE, "slotune_tls_handshake_seconds", None, "histogram",
                      "TLS handshake latency, ClientHello to the first application data, from the records "
                      "on the service's sockets"),
               Signal("tls_bytes", "slotune_tls_bytes_total", "direction", "counter",
                      "Plaintext bytes the service read or wrote through libssl"),
               Signal("tls_calls", "slotune_tls_calls_total", "direction", "counter",
                      "Successful SSL_read/SSL_write calls (and _ex forms) of the service"))
    raw_tracepoints = sockets.POINTS   # shared with the http family (hooks.py)
    hooks = (("sock_received", "tls_sock_received"), ("sock_sent", "tls_sock_sent"),
             ("sock_ended", "tls_forget"))
    helpers = PT_REGS
    defines = {f"TLS_{d.upper()}": i for i, d in enumerate(DIRECTIONS)}
    maps = {"tls_conns": Map(16384, True, "a handshake in progress is not timed"),
            "tls_calls": Map(16384, True, "an SSL_read or SSL_write call in progress is not counted")}

    def __init__(self):
        self.defines = {**self.defines, **sockets.layout()}
        self.raw_tracepoints = sockets.points()
        self.tracepoints = sockets.syscall_points()
        self.libraries: dict[tuple[int, int], str] = {}   # (dev, inode) -> path probed
        self.with_libssl: set[int] = set()                # processes whose libssl is probed

    @classmethod
    def attach_points(cls) -> list[str]:
        return super().attach_points() + [f"{kind}:libssl:{symbol}" for symbol in ENTRY
                                          for kind in ("uprobe", "uretprobe")]

    def label(self, signal: str, label_id: int, service: str) -> str:
        if signal == TLS_HANDSHAKE:
            return ""
        return DIRECTIONS[label_id] if label_id < len(DIRECTIONS) else "read"

    def refresh(self, program, targets, service_ids) -> None:
        # Python loads libssl on `import ssl`, possibly long after start: keep looking
        # at processes until their libssl shows up.
        alive = set()
        for procs in targets.values():
            alive |= procs.tgids
            for pid in procs.tgids - self.with_libssl:
                for path in libssl_paths(pid):
                    self.attach_library(program, path)
                    self.with_libssl.add(pid)
        self.with_libssl &= alive

    def attach_library(self, program, path: str) -> None:
        try:
            st = os.stat(path)
        except OSError:
            return
        if (st.st_dev, st.st_ino) in self.libraries:
            return
        self.libraries[(st.st_dev, st.st_ino)] = path
        for symbol, fn in ENTRY.items():
            program.attach(Attachment("uprobe", path, fn, symbol))
            program.attach(Attachment("uretprobe", path, RETURN, symbol))
