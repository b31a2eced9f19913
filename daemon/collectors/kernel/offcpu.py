"""Off-CPU time per service and syscall class, from the scheduler (bpf/offcpu.bpf.c):
each time a watched task blocks inside a syscall, how long it was away."""
import logging

from daemon.collectors.kernel.btf import BtfError, offsets
from daemon.collectors.kernel.family import Family, Signal
from daemon.collectors.kernel.helpers import PT_REGS

log = logging.getLogger(__name__)
TASK_STATE = ("task_struct", "__state")

# Label ids shared with the C side as OFFCPU_<NAME>; the order is the id.
SYSCALL_CLASSES = ("other", "net", "poll", "futex", "connect", "sleep", "io")


class OffCpu(Family):
    name = source = "offcpu"
    signals = (Signal("offcpu", "slotune_offcpu_seconds", "syscall", "histogram",
                      "Time the service's tasks spent off the CPU blocked in syscalls (switched out "
                      "to switched back in), one observation per block, by syscall class"),)
    # Shared with the runqueue family: one program serves both (bpf/offcpu.bpf.c).
    tracepoints = (("sched:sched_switch", "on_sched_switch"),)
    # The syscall in progress comes from the task's saved registers (bpf/offcpu.bpf.c).
    helpers = PT_REGS
    defines = {**{f"OFFCPU_{c.upper()}": i for i, c in enumerate(SYSCALL_CLASSES)}, "FAMILY_OFFCPU": 1}

    def __init__(self):
        try:
            state_off = offsets((TASK_STATE,))[TASK_STATE]
        except BtfError as exc:
            log.warning("offcpu probes: %s; a task preempted on its way to sleep is not counted as blocked", exc)
            state_off = -1
        self.defines = {**self.defines, "OFFCPU_TASK_STATE_OFF": state_off}

    def label(self, signal: str, label_id: int) -> str:
        return SYSCALL_CLASSES[label_id] if label_id < len(SYSCALL_CLASSES) else "other"
