"""Off-CPU time by syscall class: fsync, fdatasync and sync_file_range are `io`
(they were `other`), and 5 ms sleeps read at least 5 ms at P50 (the middle of
their bucket said 4.98 ms), counted as bpftrace counts the same blocks on the
same tracepoint. The family times each block inside a syscall (from
sched_switch), so a call that returns without waiting (the pwrite into the page
cache) is not an observation; each fsync after a write waits for the disk."""
import signal

from slotune.model.service import ServiceSpec
from tests.probes.conftest import bpftrace, collected, hist

SYNCS = 100     # rounds of fsync + fdatasync + sync_file_range (and one pwrite)
# Each end of a block of the worker's (a switch-out in a sleeping state, then its next switch-in),
# as the family defines it, seen by bpftrace on the same tracepoint.
BLOCKED = """
tracepoint:sched:sched_switch {
  if (args->prev_pid == $1 && (args->prev_state & 0xff) != 0) { @out[args->prev_pid] = 1; }
  if (args->next_pid == $1 && @out[args->next_pid]) { printf("in\\n"); delete(@out[args->next_pid]); }
}
BEGIN { printf("attached\\n"); }
END { clear(@out); }
"""


def test_sync_calls_are_io(kernel, spawn, tag, tmp_path):
    worker = spawn("syncer", tag, tmp_path, SYNCS)
    collector = kernel([ServiceSpec("db", cmdline=f"syncer.py {tag}")], ["offcpu"])
    collected(collector)
    worker.stdin.write("go\n")
    worker.stdin.flush()
    assert worker.stdout.readline().strip() == "done"
    h = collected(collector)["db"].histograms
    io, other = hist(h, ("offcpu", "io")).count, hist(h, ("offcpu", "other")).count
    print(f"io {io}, other {other}")
    assert io >= SYNCS                # every fsync after a write blocks (ext4 here: 308-406 blocks)
    assert other < SYNCS              # the syncs were all counted here before


def test_sleep_quantiles_never_read_below_the_sleep(kernel, spawn, tag):
    sleeper = spawn("sleeper", tag, 100, 0.005, 0.0)
    collector = kernel([ServiceSpec("s", cmdline=f"sleeper.py {tag}")], ["offcpu"])
    tracer = bpftrace(BLOCKED, sleeper.pid)
    try:
        collected(collector)
        sleeper.stdin.write("go\n")
        sleeper.stdin.flush()
        assert sleeper.stdout.readline().strip() == "done"
        _, blocked, _, preempted = sleeper.stdout.readline().split()
        h = hist(collected(collector)["s"].histograms, ("offcpu", "sleep"))
    finally:
        tracer.send_signal(signal.SIGINT)
        out, _ = tracer.communicate(timeout=30)
    theirs = sum(line.strip() == "in" for line in out.splitlines())
    blocked, preempted = int(blocked), int(preempted)
    print(f"{h.count} sleeps seen, bpftrace {theirs}; the worker's own count: {blocked} blocked, {preempted} "
          f"preempted; p1 {h.quantile(0.01) * 1e3:.3f} ms, p50 {h.quantile(0.5) * 1e3:.3f} ms, "
          f"mean {h.mean() * 1e3:.3f} ms, buckets {[int(c) for c in h.counts[h.counts > 0]]}")
    # The sleeps really block: the kernel counts the worker's voluntary switches. And each block
    # the scheduler's tracepoints show ending is one observation, as bpftrace counts them on the
    # same tracepoints: under load the kernel now and then lets a sleep end with neither a
    # sched_wakeup nor a switch-in (2026-12-05, 2 runs of 16 beside four CPU hogs: 101
    # blocked switch-outs, 100 wake-ups and 100 switch-ins, in bpftrace and slotune alike),
    # so the worker's own count is no bound. A preemption on the way to sleep (its state set) is
    # one more observation here, which the tracepoint's record shows as a preemption (R+), not
    # a block: rare, as the window is a few instructions (equal counts in 23 runs that day).
    assert blocked >= 95
    assert theirs <= h.count <= theirs + 2
    assert h.quantile(0.5) >= 0.005
