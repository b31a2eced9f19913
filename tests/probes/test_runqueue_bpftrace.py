"""Run-queue wait against bpftrace on the same tracepoints: a runqlat-style
bpftrace script (BCC's runqlat definition: from sched_wakeup/sched_wakeup_new,
or an involuntary switch-out, to the next switch-in) prints every wait of one
sleeper's thread while slotune's runqueue family times the same thread, beside a
CPU hog pinned to its CPU. Same count within 2 %, P50 and P99 within 10 % (of
the reference's values two ranks either side: see the test)."""
import threading

import numpy as np

from slotune.model.service import ServiceSpec
from tests.probes.agreement import record
from tests.probes.conftest import bpftrace, collected, hist, settled, stop
from tests.probes.test_runqueue import SLEEP_S, WORK_S, wait_burning

WAKEUPS = 200
KEY = ("runqueue_wait", "")
SCRIPT = """
tracepoint:sched:sched_wakeup, tracepoint:sched:sched_wakeup_new /args->pid == $1/ { @since[args->pid] = nsecs; }
tracepoint:sched:sched_switch {
  if (args->prev_pid == $1 && (args->prev_state & 0xff) == 0) { @since[args->prev_pid] = nsecs; }
  if (args->next_pid == $1 && @since[args->next_pid]) {
    printf("%llu\\n", nsecs - @since[args->next_pid]); delete(@since[args->next_pid]);
  }
}
BEGIN { printf("attached\\n"); }
END { clear(@since); }
"""


def test_runqueue_wait_agrees_with_bpftrace(kernel, spawn, tag):
    collector = kernel([ServiceSpec("a", cmdline=f"sleeper.py {tag}-a")], ["runqueue"])
    sleeper = spawn("sleeper", f"{tag}-a", WAKEUPS, SLEEP_S, WORK_S, cpu=0, nice=19)
    wait_burning(spawn("hog", tag, cpu=0).pid)
    tracer = bpftrace(SCRIPT, sleeper.pid)
    try:
        theirs: list[int] = []
        reader = threading.Thread(target=lambda: theirs.extend(int(line) for line in tracer.stdout
                                                               if line.strip().isdigit()), daemon=True)
        reader.start()
        collector.refresh()
        collected(collector)
        sleeper.stdin.write("go\n")
        sleeper.stdin.flush()
        assert sleeper.stdout.readline().strip() == "done"
        ours = hist(collected(collector)["a"].histograms, KEY)
        settled(lambda: len(theirs))
    finally:
        stop(tracer)
    reader.join(timeout=10)
    waits = np.array(theirs) / 1e9
    print(f"waits: slotune {ours.count}, bpftrace {len(waits)}; "
          + ", ".join(f"P{q:g} slotune {ours.quantile(q / 100) * 1e3:.3f} ms bpftrace "
                      f"{np.quantile(waits, q / 100) * 1e3:.3f} ms" for q in (50, 99)))
    record("run-queue waits counted", "bpftrace runqlat-style script on the same tracepoints", ours.count,
           len(waits), "waits", "within 2 %")
    assert len(waits) >= WAKEUPS
    assert abs(ours.count - len(waits)) <= 0.02 * len(waits)
    # A quantile read from buckets and one read from the sorted values may pick neighbouring
    # ranks, and the few waits at the P99 of a few hundred are far apart (137 and 476 ms in
    # one run): the bound is 10 % beyond the values two ranks either side.
    n = len(waits)
    for q in (50, 99):
        mine, ref = ours.quantile(q / 100), float(np.quantile(waits, q / 100))
        lo, hi = (float(np.quantile(waits, min(max(q / 100 + d / n, 0.0), 1.0))) for d in (-2, 2))
        record(f"run-queue wait P{q}", "bpftrace runqlat-style script on the same tracepoints", mine * 1e3,
               ref * 1e3, "ms", "within 10 % of the values two ranks either side")
        assert 0.9 * lo <= mine <= 1.1 * hi, f"P{q}: {mine * 1e3:.3f} ms, bpftrace {lo * 1e3:.3f}..{hi * 1e3:.3f} ms"
