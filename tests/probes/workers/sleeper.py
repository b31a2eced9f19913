"""Test worker: after a line on stdin, N times: spins for WORK_S then sleeps for
SLEEP_S (N wake-ups); prints "done", then blocks on stdin. argv: TAG N SLEEP_S WORK_S."""
import sys
import time

_, tag, n, sleep_s, work_s = sys.argv
sleep_s, work_s = float(sleep_s), float(work_s)
sys.stdin.readline()
for _ in range(int(n)):
    end = time.perf_counter() + work_s
    while time.perf_counter() < end:
        pass
    time.sleep(sleep_s)
print("done", flush=True)
sys.stdin.readline()
