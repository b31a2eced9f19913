"""collect() never raises: while reading the histogram maps fails, the counters
still come each interval; while both fail, so do the rescan and the drop count,
the interval still returns its services; each kind of failure is logged once;
once reads work again, the deltas held back arrive whole."""
import logging

from slotune.model.service import ServiceSpec
from tests.probes.conftest import collected

RUNS = 5                        # programs the worker runs per round, plus one from a thread
KEY = ("process_execs", "")


def broken(*_):
    raise OSError("injected map read failure")


def total_count(hists: dict) -> int:
    return int(sum(h.sum() for h in hists.values()))


def test_failing_reads_cost_one_log_line_each_and_no_data(kernel, spawn, tag, monkeypatch, caplog):
    collector = kernel([ServiceSpec("a", cmdline=f"execer.py {tag}")], ["exec", "offcpu"])
    worker = spawn("execer", tag, RUNS)
    assert worker.stdout.readline().strip() == "ready"
    collector.refresh()
    collected(collector)
    held_back_from = total_count(collector.program.histograms()[0])

    def round_trip():
        worker.stdin.write("go\n")
        worker.stdin.flush()
        assert worker.stdout.readline().strip() == "done"
        return collected(collector)

    program = collector.program
    with caplog.at_level(logging.ERROR, logger="slotune.collectors.kernel.collector"):
        monkeypatch.setattr(program, "histograms", broken)
        for _ in range(2):
            got = round_trip()["a"]
            assert got.counters[KEY] == RUNS + 1 and not got.histograms
        monkeypatch.setattr(program, "counters", broken)
        monkeypatch.setattr(program, "map_full", broken)
        monkeypatch.setattr(collector.targeting, "scan", broken)
        got = round_trip()["a"]
        assert not got.counters and not got.histograms and got.gauges[("processes", "")] >= 1
        monkeypatch.undo()
        got = round_trip()["a"]
    assert collector.up
    assert got.counters[KEY] == 2 * (RUNS + 1)          # the round it could not read, and this one
    delivered = sum(h.count for h in got.histograms.values())
    assert delivered == total_count(collector.program.histograms()[0]) - held_back_from > 0
    said = [r.getMessage() for r in caplog.records]
    for kind in ("histograms read", "counters read", "map_full read", "refresh"):
        assert sum(m.startswith(f"kernel collector: {kind} failed") for m in said) == 1, said
