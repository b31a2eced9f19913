"""Whether the running kernel has the BPF helpers a probe family calls beyond the
baseline every family uses (Linux 5.11), asked of the kernel's verifier through
libbpf's libbpf_probe_bpf_helper before anything is compiled, and the one line
that says a family is off for lack of one; the collector logs it at start-up and
`slotune doctor` prints it."""
from __future__ import annotations

import ctypes
import functools
import platform
import re
from typing import NamedTuple

BPF_PROG_TYPE_TRACEPOINT = 5   # the kind of program that calls them (offcpu's sched_switch)


class Helper(NamedTuple):
    """A BPF helper: its name, its id (enum bpf_func_id in linux/bpf.h) and the Linux release that added it."""
    name: str
    id: int
    since: tuple[int, int]


# What reading a task's saved user registers takes (current_regs in bpf/common.h):
# the syscall in progress (offcpu), a syscall's arguments at its exit (http, tls).
PT_REGS = (Helper("bpf_get_current_task_btf", 158, (5, 11)), Helper("bpf_task_pt_regs", 175, (5, 15)))


def release() -> tuple[int, int]:
    m = re.match(r"(\d+)\.(\d+)", platform.release())
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


@functools.cache
def present(helper: Helper) -> bool:
    """The verifier knows this helper for tracepoint programs; where libbpf cannot be
    asked (no libbpf.so.1, which BCC itself links), the kernel release decides."""
    try:
        probe = ctypes.CDLL("libbpf.so.1").libbpf_probe_bpf_helper
    except (OSError, AttributeError):
        return release() >= helper.since
    probe.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    answer = probe(BPF_PROG_TYPE_TRACEPOINT, helper.id, None)
    return answer == 1 if answer >= 0 else release() >= helper.since   # < 0: the probe itself failed


def missing(family) -> tuple[str, str] | None:
    """(detail, fix) when this kernel lacks a helper `family` calls, else None."""
    lacking = [h for h in family.helpers if not present(h)]
    if not lacking:
        return None
    names = ", ".join(h.name for h in lacking)
    since = max(h.since for h in lacking)
    return (f"off, this kernel ({platform.release()}) has no BPF helper {names} "
            f"(Linux >= {since[0]}.{since[1]}); the other probe families go on",
            f"boot Linux >= {since[0]}.{since[1]} for {family.name}")
