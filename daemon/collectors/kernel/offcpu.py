"""Blocking time per service and syscall class (bpf/offcpu.bpf.c)."""
from daemon.collectors.kernel.family import Family, Signal

# Label ids shared with the C side as OFFCPU_<NAME>; the order is the id.
SYSCALL_CLASSES = ("other", "net", "poll", "futex", "connect", "sleep", "io")


class OffCpu(Family):
    name = source = "offcpu"
    signals = (Signal("offcpu", "slotune_offcpu_seconds", "syscall", "histogram",
                      "Time the service's tasks spent inside syscalls, by syscall class"),)
    tracepoints = (("raw_syscalls:sys_enter", "on_sys_enter"),
                   ("raw_syscalls:sys_exit", "on_sys_exit"))
    defines = {f"OFFCPU_{c.upper()}": i for i, c in enumerate(SYSCALL_CLASSES)}

    def label(self, signal: str, label_id: int) -> str:
        return SYSCALL_CLASSES[label_id] if label_id < len(SYSCALL_CLASSES) else "other"
