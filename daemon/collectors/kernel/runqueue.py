"""Run-queue wait per service (bpf/runqueue.bpf.c)."""
from daemon.collectors.kernel.family import Family, Signal


class RunQueue(Family):
    name = source = "runqueue"
    signals = (Signal("runqueue_wait", "slotune_runqueue_wait_seconds", None, "histogram",
                      "Time the service's tasks waited runnable for a CPU"),)
    tracepoints = (("sched:sched_wakeup", "on_sched_wakeup"),
                   ("sched:sched_wakeup_new", "on_sched_wakeup_new"),
                   ("sched:sched_switch", "on_sched_switch"))   # shared with offcpu (bpf/offcpu.bpf.c)
    defines = {"FAMILY_RUNQUEUE": 1}
