"""A baseline store that fails under the daemon: locked by another process for
15 s, and on a disk that is full for 60 steps (a real 2 MiB tmpfs). Each step
still finishes (bounded wait), the failure is said once and counted in
slotune_baseline_store_errors_total, and recording resumes when the store does.
A store or guard state file found corrupt at start is moved aside and the
daemon starts fresh."""
import os
import sqlite3
import subprocess
import sys
import time

import pytest

from slotune import config
from slotune.collectors.service_metrics import ServiceMetricsCollector
from slotune.control.guard_state import GuardFile
from slotune.process import Daemon
from slotune.store.baselines import BaselineStore
from slotune.store.recorder import RECORD_EVERY_S
from tests.adversarial.service_double import ServiceDouble
from tests.adversarial.service_double import config as config_text

pytestmark = pytest.mark.slow


@pytest.fixture
def double():
    d = ServiceDouble({"rate_limit_rps": 500.0, "concurrency_limit": 64})
    yield d
    d.close()


def make_daemon(double, work, store_dir=None) -> Daemon:
    text = config_text(double, 1, work, dry_run=True)
    if store_dir is not None:
        text = text.replace(f'"{work}/baselines.sqlite"', f'"{store_dir}/baselines.sqlite"')
    (work / "slotune.toml").write_text(text)
    cfg = config.load(work / "slotune.toml")
    # The subject is the store: each step waits for its read of the double, up to 30 s. With the
    # daemon's 0.8 s, one read beside stress-ng --cpu 2 took longer, and the back-off after it
    # skipped the steps that were to write into the full disk (0 errors counted of 30).
    metrics = ServiceMetricsCollector(timeout_s=30.0)
    metrics.read_wait_s = 30.0
    metrics.start([s.spec for s in cfg.services])     # Daemon.start() would also serve HTTP
    return Daemon(cfg, collectors=[metrics])


def points(path) -> int:
    with sqlite3.connect(path, timeout=30) as db:
        return db.execute("SELECT count(*) FROM points").fetchone()[0]


def run_steps(daemon, n, t0):
    """n steps of RECORD_EVERY_S simulated seconds each; the longest step's wall time."""
    longest = 0.0
    for i in range(n):
        began = time.monotonic()
        daemon.step(t0 + i * RECORD_EVERY_S, t0 + (i + 1) * RECORD_EVERY_S)
        longest = max(longest, time.monotonic() - began)
    return longest


def errors_counted(daemon) -> float:
    from prometheus_client import generate_latest
    text = generate_latest(daemon.registry).decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("slotune_baseline_store_errors_total{"))


def test_a_store_locked_for_15_s(tmp_path, double, caplog):
    daemon = make_daemon(double, tmp_path)
    try:
        run_steps(daemon, 2, 1000.0)
        before = points(tmp_path / "baselines.sqlite")
        holder = subprocess.Popen(   # another process holds the store's write lock for 15 s
            [sys.executable, "-c", "import sqlite3, sys, time\n"
             "db = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
             "db.execute('BEGIN EXCLUSIVE'); print('locked', flush=True); time.sleep(15)",
             str(tmp_path / "baselines.sqlite")], stdout=subprocess.PIPE, text=True)
        assert holder.stdout.readline().strip() == "locked"
        began = time.monotonic()
        longest = 0.0
        while holder.poll() is None:
            longest = max(longest, run_steps(daemon, 1, 2000.0 + (time.monotonic() - began) * 100))
        assert time.monotonic() - began > 14
        assert longest < 3.0, f"a step waited {longest:.1f} s on the locked store"
        assert errors_counted(daemon) >= 5
        assert sum("database is locked" in r.getMessage() for r in caplog.records) == 1   # said once
        run_steps(daemon, 2, 9000.0)
        assert points(tmp_path / "baselines.sqlite") > before
    finally:
        daemon.close()


@pytest.fixture
def small_disk(tmp_path):
    """A real 2 MiB tmpfs (root mounts it)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], check=True)
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(filler) -> None:
    """Take what is left of filler's file system, unbuffered."""
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"\0" * 65536):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)


def test_a_disk_full_for_60_steps(tmp_path, small_disk, double, root_only):
    daemon = make_daemon(double, tmp_path, store_dir=small_disk)
    filler = small_disk / "filler"
    try:
        run_steps(daemon, 2, 1000.0)
        fill(filler)
        run_steps(daemon, 60, 2000.0)          # one record per step: 60 failing writes
        assert errors_counted(daemon) >= 30
        filler.unlink()
        before = points(small_disk / "baselines.sqlite")
        run_steps(daemon, 2, 9000.0)
        assert points(small_disk / "baselines.sqlite") > before
    finally:
        daemon.close()


# A store or guard state file found corrupt at start is moved aside (never deleted), said once at
# error level naming both paths, and the daemon starts fresh; a store merely locked is not corrupt.

def damaged(path):
    """A real store with points, then 300 bytes of a page in its middle overwritten (quick_check fails)."""
    with BaselineStore(path) as store:
        store.record_many(("gw", "p99_seconds", float(i), float(i), "prod", "d1") for i in range(5000))
    pages = path.stat().st_size // 4096
    with open(path, "r+b") as f:
        f.seek(4096 * (pages // 2) + 200)
        f.write(b"\xff" * 300)


def another_layout(path):
    """A SQLite file, but another program's: a points table without the store's columns."""
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE points (x)")


@pytest.mark.parametrize("spoil, words", [
    (lambda p: p.write_bytes(b"not a database at all " * 100), "file is not a database"),
    (damaged, "PRAGMA quick_check"),
    (another_layout, "no such column"),
], ids=["not-sqlite", "quick-check-fails", "another-layout"])
def test_a_corrupt_store_is_moved_aside_and_a_fresh_one_starts(tmp_path, caplog, spoil, words):
    path = tmp_path / "baselines.sqlite"
    spoil(path)
    before = path.read_bytes()
    with BaselineStore(path) as store:
        store.record("gw", "p99_seconds", 1.0, 1.0, "prod", "d2")
        assert [(s.deploy_id, s.count) for s in store.list()] == [("d2", 1)]
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("baselines.sqlite.corrupt-")]
    assert len(aside) == 1 and aside[0].read_bytes() == before
    said = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(said) == 1 and str(path) in said[0].getMessage() and str(aside[0]) in said[0].getMessage()
    assert words in said[0].getMessage()


def test_a_store_locked_at_start_is_not_corrupt(tmp_path):
    path = tmp_path / "baselines.sqlite"
    holder = sqlite3.connect(path, isolation_level=None)     # not yet WAL: a lock keeps everyone out
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(OSError, match="database is locked"):
            BaselineStore(path, busy_timeout_s=0.1)
    finally:
        holder.close()
    assert os.listdir(tmp_path) == ["baselines.sqlite"]


@pytest.mark.parametrize("body", ["[" * 100000, '{"version": 1, "services": {"svc": {"held_until": {"x": 1e999999}}',
                                  '{"version": 1, "services": {"svc": {"originals": {"x": 1' + "0" * 400 + "}}}}",
                                  '{"version": 1, "services": {"svc": {"pending": [{"tuner": "t", "setting": "s", '
                                  '"old": "1", "new": 2, "t": 0, "interval_s": 1, "before_p99": 1, '
                                  '"before_load": 1}]}}}', "\0\0\0"],
                         ids=["deep", "not-json", "huge-integer", "pending-of-the-wrong-kind", "zeros"])
def test_a_corrupt_guard_state_is_moved_aside_and_the_guards_start_empty(tmp_path, caplog, body):
    state = tmp_path / "state.json"
    for _ in range(2):                                    # a second one is kept beside the first
        state.write_text(body)
        assert GuardFile(state).load() == {}
    aside = sorted(p for p in tmp_path.iterdir() if p.name.startswith("state.json.corrupt-"))
    assert len(aside) == 2 and all(p.read_text() == body for p in aside) and not state.exists()
    said = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(said) == 2 and all(str(state) in m for m in said) and str(aside[0]) in said[0]


def test_the_daemon_starts_on_a_corrupt_store_and_state_file(tmp_path, double):
    (tmp_path / "baselines.sqlite").write_bytes(b"\xde\xad" * 4096)
    (tmp_path / "state.json").write_text("[" * 100000)
    daemon = make_daemon(double, tmp_path)
    try:
        run_steps(daemon, 2, 1000.0)
        assert points(tmp_path / "baselines.sqlite") > 0
    finally:
        daemon.close()
    names = sorted(p.name.split(".corrupt-")[0] for p in tmp_path.iterdir() if ".corrupt-" in p.name)
    assert names == ["baselines.sqlite", "state.json"]
