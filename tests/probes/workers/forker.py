"""Test worker: on each stdin line starts a thread and forks a child (both block
until the worker dies) and prints their task ids as "THREAD CHILD". argv: TAG."""
import ctypes
import os
import signal
import sys
import threading

_, tag = sys.argv
read_end, write_end = os.pipe()
print("ready", flush=True)
for _ in sys.stdin:
    thread = threading.Thread(target=os.read, args=(read_end, 1), daemon=True)
    thread.start()
    child = os.fork()
    if child == 0:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG: go with the parent
        os.read(read_end, 1)
        os._exit(0)
    print(thread.native_id, child, flush=True)
