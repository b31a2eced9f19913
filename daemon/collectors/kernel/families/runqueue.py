"""Run-queue wait per service (bpf/runqueue.bpf.c)."""
from slotune.collectors.kernel import sched
from slotune.collectors.kernel.family import Family, Map, Points, Signal
from slotune.model.signals import RUNQUEUE_WAIT


class RunQueue(Family):
    name = source = "runqueue"
    signals = (Signal(RUNQUEUE_WAIT, "slotune_runqueue_wait_seconds", None, "histogram",
                      "Time the service's tasks waited runnable for a CPU"),)
    raw_tracepoints: Points = (("sched:sched_wakeup", "on_sched_wakeup"),
                               ("sched:sched_wakeup_new", "on_sched_wakeup_new"),
                               sched.SWITCH)   # shared with the offcpu family (hooks.py)
    hooks = (("sched_switch", "runqueue_switch"),)
    maps = {"runqueue_since": Map(16384, True, "a runnable task's wait for a CPU is not observed, the longest "
                                               "waits first")}

    def __init__(self):
        self.defines = {**self.defines, **sched.layout()}
        self.raw_tracepoints = sched.points(*self.raw_tracepoints)
