"""Test worker: on each stdin line starts a thread and forks a child (both block
until stdin closes) and prints their task ids as "THREAD CHILD". argv: TAG."""
import os
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
        os.read(read_end, 1)
        os._exit(0)
    print(thread.native_id, child, flush=True)
