"""The daemon's signals land anywhere in its wait and still stop it. Each run is a fresh
Python process that sleeps in slotune.host.signals the way the main loop does and, from a
trace function, sends itself SIGTERM at its k-th executed line, for every k through two
turns of the loop: the handler then runs at that point of the wait. The daemon used to
set a threading.Event from its handler; under this harness that design hung at 24 of 40
positions (2026-12-05, Python 3.11: the handler blocked on the Event's lock that the
interrupted wait held), as a clean-clone CI run's daemon did once on SIGTERM."""
import json
import subprocess
import sys

from tests.conftest import ROOT

SLEEPER = """
import json, os, signal, sys
from slotune.host.signals import Signals

k, lines = int(sys.argv[1]), 0
signals = Signals()
signals.install()

def trace(frame, event, arg):
    global lines
    if event == "line":
        lines += 1
        if lines == k:
            os.kill(os.getpid(), signal.SIGTERM)
    return trace

sys.settrace(trace)
while not signals.stop:
    signals.sleep(0.05)
sys.settrace(None)
print(json.dumps({"lines": lines}))
"""


def test_a_sigterm_at_any_line_of_the_wait_stops_it(tmp_path):
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    hung = []
    for k in range(1, 41):
        try:
            out = subprocess.run([sys.executable, str(script), str(k)], cwd=ROOT, capture_output=True, text=True,
                                 timeout=5, check=True).stdout
        except subprocess.TimeoutExpired:     # run() kills it with SIGKILL: a hung handler ignores SIGTERM
            hung.append(k)
            continue
        assert json.loads(out)["lines"] >= k
    assert not hung, f"SIGTERM at these lines of the wait never stopped it: {hung}"


def test_a_signal_ends_the_sleep_at_once_and_sighup_only_asks_for_a_reload(tmp_path):
    script = tmp_path / "hup.py"
    script.write_text("""
import json, os, signal, threading, time
from slotune.host.signals import Signals
signals = Signals()
signals.install()
threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGHUP)).start()
t0 = time.monotonic()
signals.sleep(10)
woke, reload, stop = time.monotonic() - t0, signals.reload, signals.stop
threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM)).start()
signals.sleep(10)
t1 = time.monotonic()
signals.sleep(10)                       # once stopped, it no longer sleeps
print(json.dumps({"woke": woke, "reload": reload, "stop": stop, "stopped": signals.stop,
                  "after": time.monotonic() - t1}))
signals.close()
""")
    out = json.loads(subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True,
                                    timeout=30, check=True).stdout)
    assert out["woke"] < 2 and out["reload"] and not out["stop"], out
    assert out["stopped"] and out["after"] < 0.1, out
