"""Off-CPU time by syscall class: fsync, fdatasync and sync_file_range are `io`
(they were `other`), and 5 ms sleeps read at least 5 ms at P50 (the middle of
their bucket said 4.98 ms). The family times each block inside a syscall (from
sched_switch), so a call that returns without waiting (the pwrite into the page
cache) is not an observation; each fsync after a write waits for the disk."""
from daemon.model.service import ServiceSpec
from tests.probes.conftest import collected, hist

SYNCS = 100     # rounds of fsync + fdatasync + sync_file_range (and one pwrite)


def test_sync_calls_are_io(kernel, spawn, tag, tmp_path):
    worker = spawn("syncer", tag, tmp_path, SYNCS)
    collector = kernel([ServiceSpec("db", cmdline=f"syncer.py {tag}")], ["offcpu"])
    collected(collector)
    worker.stdin.write("go\n")
    worker.stdin.flush()
    assert worker.stdout.readline().strip() == "done"
    h = collected(collector)["db"].histograms
    io, other = hist(h, ("offcpu", "io")).count, hist(h, ("offcpu", "other")).count
    print(f"io {io}, other {other}")
    assert io >= SYNCS                # every fsync after a write blocks (ext4 here: 308-406 blocks)
    assert other < SYNCS              # the syncs were all counted here before


def test_sleep_quantiles_never_read_below_the_sleep(kernel, spawn, tag):
    sleeper = spawn("sleeper", tag, 100, 0.005, 0.0)
    collector = kernel([ServiceSpec("s", cmdline=f"sleeper.py {tag}")], ["offcpu"])
    collected(collector)
    sleeper.stdin.write("go\n")
    sleeper.stdin.flush()
    assert sleeper.stdout.readline().strip() == "done"
    h = hist(collected(collector)["s"].histograms, ("offcpu", "sleep"))
    print(f"{h.count} sleeps: p1 {h.quantile(0.01) * 1e3:.3f} ms, p50 {h.quantile(0.5) * 1e3:.3f} ms, "
          f"mean {h.mean() * 1e3:.3f} ms, buckets {[int(c) for c in h.counts[h.counts > 0]]}")
    assert h.count == 100
    assert h.quantile(0.5) >= 0.005
