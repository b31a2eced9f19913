"""The scheduler's tracepoints as the offcpu and runqueue families attach them:
raw, so the kernel builds no trace record for any context switch or wake-up on
the host. Their programs get the tracepoint's own arguments (task_struct
pointers), so they read a task's tid at the offset the running kernel's BTF
gives for task_struct.pid, and a switched-out task's state from sched_switch's
prev_state argument (Linux >= 5.18) or else from its task_struct.__state.
Without BTF those programs are not attached, said in one line."""
from __future__ import annotations

import functools
import logging

from slotune.collectors.kernel.btf import BtfError, offsets
from slotune.collectors.kernel.helpers import release

log = logging.getLogger(__name__)

TASK_PID = ("task_struct", "pid")         # a task's tid
TASK_STATE = ("task_struct", "__state")   # TASK_INTERRUPTIBLE and the like
SWITCH = ("sched:sched_switch", "on_sched_switch")


@functools.cache
def layout() -> dict[str, int]:
    """The #defines bpf/common.h reads the scheduler's raw arguments with (-1: no BTF)."""
    try:
        off = offsets((TASK_PID, TASK_STATE))
    except BtfError as exc:
        log.warning("offcpu and runqueue probes: %s; the scheduler's tracepoints are not attached "
                    "(fix: a kernel built with CONFIG_DEBUG_INFO_BTF)", exc)
        return {"SCHED_TASK_PID_OFF": -1, "SCHED_TASK_STATE_OFF": -1, "SCHED_SWITCH_STATE_ARG": 0}
    return {"SCHED_TASK_PID_OFF": off[TASK_PID], "SCHED_TASK_STATE_OFF": off[TASK_STATE],
            "SCHED_SWITCH_STATE_ARG": int(release() >= (5, 18))}


def points(*tracepoints: tuple[str, str]) -> tuple[tuple[str, str], ...]:
    """The family's raw tracepoints, or none where the kernel's BTF cannot place their arguments."""
    return tracepoints if layout()["SCHED_TASK_PID_OFF"] >= 0 else ()
