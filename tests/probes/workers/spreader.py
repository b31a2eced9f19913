"""Test worker that spreads over many map entries: on "go" sleeps SLEEPS times,
each for a different duration (2 µs to 40 ms, geometric, timer slack 1 ns so
each lands where asked: many distinct histogram slots), then forks CHILDREN
children that all live at once and prints "forked"; on "release" lets them
exit, reaps them and prints "done". argv: TAG SLEEPS CHILDREN."""
import ctypes
import os
import signal
import sys
import time

PR_SET_TIMERSLACK, PR_SET_PDEATHSIG = 29, 1
_, tag, sleeps, children = sys.argv
libc = ctypes.CDLL(None)
libc.prctl(PR_SET_TIMERSLACK, 1)
print("ready", flush=True)
sys.stdin.readline()
n = int(sleeps)
for i in range(n):
    time.sleep(2e-6 * (2e4 ** (i / (n - 1))))
read_end, write_end = os.pipe()
pids = []
for _ in range(int(children)):
    pid = os.fork()
    if pid == 0:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)   # go with the parent
        os.close(write_end)
        os.read(read_end, 1)                           # until the parent closes its end
        os._exit(0)
    pids.append(pid)
os.close(read_end)
print("forked", flush=True)
sys.stdin.readline()
os.close(write_end)
for pid in pids:
    os.waitpid(pid, 0)
print("done", flush=True)
sys.stdin.readline()
