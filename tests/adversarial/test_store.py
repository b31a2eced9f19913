"""A baseline store that fails under the daemon: locked by another process for
15 s, and on a disk that is full for 60 steps (a real 2 MiB tmpfs). Each step
still finishes (bounded wait), the failure is said once and counted in
slotune_baseline_store_errors_total, and recording resumes when the store does."""
import os
import sqlite3
import subprocess
import sys
import time

import pytest

from daemon import config
from daemon.collectors.service_metrics import ServiceMetricsCollector
from daemon.process import Daemon
from daemon.store.recorder import RECORD_EVERY_S
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
    metrics = ServiceMetricsCollector()
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
    mnt = tmp_path / "disk"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], check=True)
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_disk_full_for_60_steps(tmp_path, small_disk, double, root_only):
    daemon = make_daemon(double, tmp_path, store_dir=small_disk)
    filler = small_disk / "filler"
    try:
        run_steps(daemon, 2, 1000.0)
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT)   # fill what is left, unbuffered
        try:
            while os.write(fd, b"\0" * 65536):
                pass
        except OSError:
            pass
        finally:
            os.close(fd)
        run_steps(daemon, 60, 2000.0)          # one record per step: 60 failing writes
        assert errors_counted(daemon) >= 30
        filler.unlink()
        before = points(small_disk / "baselines.sqlite")
        run_steps(daemon, 2, 9000.0)
        assert points(small_disk / "baselines.sqlite") > before
    finally:
        daemon.close()
