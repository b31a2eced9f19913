"""Fixtures for the live-kernel probe tests: worker processes that are always
killed, kernel collectors that are always closed, a unique tag per test so
command-line matching never catches anyone else's processes, and bpftrace
scripts started as references on the same kernel points."""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from slotune.collectors.kernel import KernelCollector
from slotune.collectors.kernel.maps import items
from slotune.model.histogram import Histogram

WORKERS = Path(__file__).resolve().parent / "workers"


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).resolve().parent
    for item in items:
        if here in Path(item.fspath).resolve().parents:
            item.add_marker(pytest.mark.kernel)


@pytest.fixture
def tag():
    return f"slotune-test-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def spawn():
    """spawn(worker, *args, prefix=[], cpu=None, nice=None) -> Popen with pipes; killed at teardown."""
    procs = []

    def start(worker, *args, prefix=(), cpu=None, nice=None):
        def setup():
            if cpu is not None:
                os.sched_setaffinity(0, {cpu})
            if nice is not None:
                os.setpriority(os.PRIO_PROCESS, 0, nice)
        p = subprocess.Popen([*prefix, sys.executable, str(WORKERS / f"{worker}.py"), *map(str, args)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, preexec_fn=setup)
        procs.append(p)
        return p

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=10)
        for f in (p.stdin, p.stdout):
            if f:
                f.close()


@pytest.fixture
def started():
    """started(argv) -> Popen of any program, with pipes (stderr into stdout), in a session of
    its own; at teardown its whole process group is killed (nginx's workers outlive a killed
    master otherwise, and their finders' matches with them)."""
    with contextlib.ExitStack() as stack:
        def start(argv):
            p = stack.enter_context(subprocess.Popen([str(a) for a in argv], stdin=subprocess.PIPE,
                                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                                     start_new_session=True))
            stack.callback(kill_group, p)
            return p
        yield start


def kill_group(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.fixture
def kernel(root_only):
    """kernel(services, families=None, map_entries=None, rescan_s=0.0) -> a started
    KernelCollector, closed at teardown."""
    made = []

    def start(services, families=None, map_entries=None, rescan_s=0.0):
        c = KernelCollector(families, map_entries, rescan_s)
        made.append(c)
        c.start(services)
        assert c.up, c.start_error
        return c

    yield start
    for c in made:
        c.close()


def bpftrace(script: str, *args) -> subprocess.Popen:
    """A bpftrace script (`bpftrace -e script args...`, its BEGIN printing "attached"),
    returned once attached, its stdout piped as text; the caller stops it. Fails the test,
    naming the fix, where bpftrace is missing."""
    if not shutil.which("bpftrace"):
        pytest.fail("bpftrace missing: apt-get install bpftrace (scripts/setup.sh installs it)")
    tracer = subprocess.Popen(["bpftrace", "-e", script, *map(str, args)], stdout=subprocess.PIPE, text=True)
    try:
        assert "attached" in (tracer.stdout.readline() + tracer.stdout.readline())   # after "Attaching N probes..."
    except BaseException:
        tracer.kill()
        tracer.wait(timeout=30)
        raise
    return tracer


def stop(tracer: subprocess.Popen, wait_s: float = 10.0) -> None:
    """Stops a bpftrace script: SIGTERM, and SIGKILL where it has not ended in wait_s.
    bpftrace 0.17 on sched_switch beside a busy CPU can leave a SIGTERM unanswered for
    more than 30 s (CI, 2026-12-06); its printf lines are flushed one by one, so what
    was printed is on the pipe either way."""
    tracer.terminate()
    try:
        tracer.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        tracer.kill()
        tracer.wait(timeout=30)


def settled(count, quiet_s: float = 0.5, deadline_s: float = 10.0) -> int:
    """count() once it has not changed for quiet_s (or at deadline_s): lines a tracer
    had still to print when the traced work ended."""
    deadline = time.monotonic() + deadline_s
    last, since = count(), time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - since < quiet_s:
        time.sleep(0.05)
        now = count()
        if now != last:
            last, since = now, time.monotonic()
    return last


def collected(collector, settle_s: float = 2.0) -> dict:
    """One interval's Sample per service name, taken once every HTTP response the
    services have written is over (up to settle_s): the kernel records a response
    when it ends (the next request, end of file or close), which the server sees
    a moment after its client has the last byte and has hung up."""
    deadline = time.monotonic() + settle_s
    while responses_open(collector) and time.monotonic() < deadline:
        time.sleep(0.01)
    return {s.service: s for s in collector.collect(0.0, 0.0)}


def responses_open(collector) -> int:
    """Responses written on connections whose end the http family has not seen yet."""
    if collector.program is None or "http" not in {f.name for f in collector.families}:
        return 0
    return sum(1 for _, c in items(collector.program.table("http_conns")) if c.request_at and c.last_write_at)


def hist(histograms: dict, key) -> Histogram:
    return histograms.get(key, Histogram())
