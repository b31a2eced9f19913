"""Test worker: on each stdin line runs N programs (/bin/true, a fork and an exec
each), then one more exec'd from a second thread of a forked child (the thread
takes the process's id), and prints "done". argv: TAG N."""
import os
import subprocess
import sys
import threading

TRUE = "/bin/true"
_, tag, n = sys.argv
print("ready", flush=True)
for _ in sys.stdin:
    for _ in range(int(n)):
        subprocess.run([TRUE], check=True)
    child = os.fork()
    if child == 0:
        threading.Thread(target=os.execv, args=(TRUE, [TRUE])).start()
        threading.Event().wait()          # the thread's exec ends this thread too
    os.waitpid(child, 0)
    print("done", flush=True)
