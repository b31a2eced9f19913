"""Run-queue wait per service (bpf/runqueue.bpf.c)."""
from daemon.collectors.kernel.program import Family


class RunQueue(Family):
    name = source = "runqueue"
    signals = ("runqueue_wait",)
    tracepoints = (("sched:sched_wakeup", "on_sched_wakeup"),
                   ("sched:sched_wakeup_new", "on_sched_wakeup_new"),
                   ("sched:sched_switch", "on_sched_switch"))
