"""Off-CPU time per service and syscall class, from the scheduler (bpf/offcpu.bpf.c):
each time a watched task blocks inside a syscall, how long it was away."""
from slotune.collectors.kernel import sched
from slotune.collectors.kernel.family import Family, Map, Points, Signal
from slotune.collectors.kernel.helpers import PT_REGS
from slotune.model.signals import OFFCPU

# Label ids shared with the C side as OFFCPU_<NAME>; the order is the id.
SYSCALL_CLASSES = ("other", "net", "poll", "futex", "connect", "sleep", "io")


class OffCpu(Family):
    name = source = "offcpu"
    signals = (Signal(OFFCPU, "slotune_offcpu_seconds", "syscall", "histogram",
                      "Time the service's tasks spent off the CPU blocked in syscalls (switched out "
                      "to switched back in), one observation per block, by syscall class"),)
    raw_tracepoints: Points = (sched.SWITCH,)   # shared with the runqueue family (hooks.py)
    hooks = (("sched_switch", "offcpu_switch"),)
    # The syscall in progress comes from the task's saved registers (bpf/offcpu.bpf.c).
    helpers = PT_REGS
    defines = {f"OFFCPU_{c.upper()}": i for i, c in enumerate(SYSCALL_CLASSES)}
    maps = {"offcpu_since": Map(16384, True, "a blocked task's time off the CPU is not observed, the longest "
                                             "blocks first")}

    def __init__(self):
        self.defines = {**self.defines, **sched.layout()}
        self.raw_tracepoints = sched.points(*self.raw_tracepoints)

    def label(self, signal: str, label_id: int, service: str) -> str:
        return SYSCALL_CLASSES[label_id] if label_id < len(SYSCALL_CLASSES) else "other"
