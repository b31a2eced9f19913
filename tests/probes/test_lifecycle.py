"""Probes come and go cleanly: close() (twice) leaves no program in the kernel,
SIGTERM to `slotune probes --watch` neither; a probe that cannot attach is
reported once and the others keep working."""
import logging
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from slotune.collectors.kernel.family import Attachment
from slotune.model.service import ServiceSpec
from tests.conftest import ROOT
from tests.probes.conftest import collected


def loaded(prog_id: int) -> bool:
    return subprocess.run(["bpftool", "prog", "show", "id", str(prog_id)], capture_output=True).returncode == 0


def prog_ids_of(pid: int) -> set[int]:
    ids = set()
    for fdinfo in Path(f"/proc/{pid}/fdinfo").iterdir():
        try:
            ids |= {int(m) for m in re.findall(r"^prog_id:\s+(\d+)", fdinfo.read_text(), re.M)}
        except OSError:
            pass
    return ids


def test_close_leaves_no_program_and_is_idempotent(kernel):
    collector = kernel([ServiceSpec("x", cmdline="no-such-process-anywhere")])
    ids = collector.program.prog_ids()
    assert len(ids) >= 12 and all(loaded(i) for i in ids)
    collector.close()
    collector.close()
    # A raw tracepoint's link is freed after an RCU grace period: give it a moment.
    deadline = time.monotonic() + 5
    while any(loaded(i) for i in ids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(loaded(i) for i in ids)
    assert not collector.up and collector.collect(0, 1) == []


def test_sigterm_detaches_everything(root_only, tag):
    watch = subprocess.Popen([sys.executable, "-m", "slotune.cli", "probes", "--watch", "--family", "runqueue",
                              "--service", f"x={tag}", "--interval", "0.2"], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # what attached, then the first table's time and header: the probes are on
        assert any(line.startswith("service") for line in iter(watch.stdout.readline, ""))
        ids = prog_ids_of(watch.pid)
        assert ids and all(loaded(i) for i in ids)
        watch.send_signal(signal.SIGTERM)
        assert watch.wait(timeout=20) == 0
        assert not any(loaded(i) for i in ids)
    finally:
        if watch.poll() is None:
            watch.kill()
        watch.communicate()


def test_failed_probe_reported_once_others_go_on(kernel, spawn, tag, caplog):
    collector = kernel([ServiceSpec("s", cmdline=f"sleeper.py {tag}")], ["offcpu"])
    bad = Attachment("uprobe", "/no/such/libssl.so.3", "on_ssl_read", "SSL_read")
    with caplog.at_level(logging.WARNING):
        assert collector.program.attach(bad) is False
        assert collector.program.attach(bad) is False
    reports = [r for r in caplog.records if "/no/such/libssl.so.3" in r.getMessage()]
    assert len(reports) == 1 and "did not attach" in reports[0].getMessage()
    assert collector.attached[bad.probe] is False
    sleeper = spawn("sleeper", tag, 20, 0.001, 0.0)
    time.sleep(0.2)
    collector.refresh()
    collected(collector)
    sleeper.stdin.write("go\n")
    sleeper.stdin.flush()
    assert sleeper.stdout.readline().strip() == "done"
    # A sleep whose timer fires while the worker is still on the runqueue (preempted on a
    # busy host just before it blocks) returns without blocking: the worker's own count
    # of blocked switch-outs is the reference, not the 20 it asked for.
    _, blocked, _, _ = sleeper.stdout.readline().split()
    assert int(blocked) >= 15
    assert collected(collector)["s"].histograms[("offcpu", "sleep")].count == int(blocked)
