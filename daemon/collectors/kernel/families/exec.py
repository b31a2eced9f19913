"""Programs started per service (bpf/exec.bpf.c): a service that forks and execs
a helper per request pays a process start each time, a latency smell worth a counter."""
from slotune.collectors.kernel.arrivals import EXEC
from slotune.collectors.kernel.family import Family, Signal


class Exec(Family):
    name = source = "exec"
    signals = (Signal("process_execs", "slotune_process_execs_total", None, "counter",
                      "Programs the service's processes started (successful execve)"),)
    raw_tracepoints = (EXEC,)   # the program that also sends new processes to arrivals.py
    hooks = (("process_exec", "exec_count"),)
