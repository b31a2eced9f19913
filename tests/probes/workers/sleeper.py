"""Test worker: after a line on stdin, N times: spins for WORK_S then sleeps for
SLEEP_S (N wake-ups); prints "done", then on a line of its own how many times
the kernel switched it out meanwhile ("blocked V preempted I": its voluntary
and involuntary context switches, getrusage), then blocks on stdin.
argv: TAG N SLEEP_S WORK_S.
Each sleep is libc's nanosleep, relative, so it blocks: Python's time.sleep
sleeps to a deadline it computed a moment before (clock_nanosleep,
TIMER_ABSTIME) and returns without blocking when the process was kept off the
CPU past it. The switch counts say how often the kernel really blocked it."""
import ctypes
import resource
import sys
import time

_, tag, n, sleep_s, work_s = sys.argv
sleep_s, work_s = float(sleep_s), float(work_s)


class Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


nanosleep = ctypes.CDLL("libc.so.6", use_errno=True).nanosleep
pause = Timespec(int(sleep_s), int(sleep_s % 1 * 1e9))
sys.stdin.readline()
before = resource.getrusage(resource.RUSAGE_SELF)
for _ in range(int(n)):
    end = time.perf_counter() + work_s
    while time.perf_counter() < end:
        pass
    nanosleep(ctypes.byref(pause), None)
after = resource.getrusage(resource.RUSAGE_SELF)
print("done", flush=True)
print(f"blocked {after.ru_nvcsw - before.ru_nvcsw} preempted {after.ru_nivcsw - before.ru_nivcsw}", flush=True)
sys.stdin.readline()
