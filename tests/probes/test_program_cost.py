"""What each BPF program costs, as exported (slotune_bpf_program_runs_total and
_run_seconds_total{program}), against references slotune does not compute: the
kernel's own count of context switches (/proc/stat ctxt, one per sched_switch,
which runs on_sched_switch once each) and bpftool's read of the same programs.
With kernel.bpf_stats_enabled at 0 nothing is exported and start-up says so."""
import json
import logging
import subprocess
import time

import pytest

from slotune.collectors.kernel import program_cost
from slotune.collectors.kernel.program import fdinfo
from slotune.model.service import ServiceSpec


@pytest.fixture
def stats(root_only):
    """set(on): kernel.bpf_stats_enabled for the test; put back as it was at teardown."""
    was = program_cost.STATS_SYSCTL.read_text()

    def put(on: bool) -> None:
        program_cost.STATS_SYSCTL.write_text("1" if on else "0")
    yield put
    program_cost.STATS_SYSCTL.write_text(was)


def exported(collector) -> dict[str, dict[str, float]]:
    """metric name -> program -> value, as the exporter would serve them."""
    out: dict[str, dict[str, float]] = {}
    for family in collector.program_cost.collect():
        for s in family.samples:
            out.setdefault(s.name, {})[s.labels["program"]] = s.value
    return out


def switches() -> int:
    with open("/proc/stat") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("ctxt "))


def bpftool_runs(prog_id: int) -> int:
    shown = json.loads(subprocess.run(["bpftool", "prog", "show", "id", str(prog_id), "--json"],
                                      capture_output=True, text=True, check=True).stdout)
    return shown.get("run_cnt", 0)


def test_runs_match_the_kernels_context_switches_and_bpftool(kernel, stats):
    stats(True)
    collector = kernel([ServiceSpec("x", cmdline="no-such-process-anywhere")], families=["runqueue"])
    prog_id = int(fdinfo(collector.program.fds()["on_sched_switch"])["prog_id"])
    before = exported(collector)
    ctxt_before = switches()
    for _ in range(200):           # context switches of our own, beside the host's
        time.sleep(0.001)
    ctxt_after = switches()
    after = exported(collector)
    tool_before = bpftool_runs(prog_id)
    runs_now = exported(collector)["slotune_bpf_program_runs_total"]["on_sched_switch"]
    tool_after = bpftool_runs(prog_id)
    runs = after["slotune_bpf_program_runs_total"]
    ran = runs["on_sched_switch"] - before["slotune_bpf_program_runs_total"]["on_sched_switch"]
    counted = ctxt_after - ctxt_before
    # one run a switch: the two counts differ by the switches between the reads, on either CPU
    # (and by a run the kernel skipped now and then: 419 runs for 421 switches seen once)
    assert counted >= 200 and abs(ran - counted) <= 10 + counted // 50, (ran, counted)
    assert tool_before <= runs_now <= tool_after
    assert {"on_sched_wakeup", "on_sched_wakeup_new", "on_sched_switch"} <= set(runs)
    spent = (after["slotune_bpf_program_run_seconds_total"]["on_sched_switch"]
             - before["slotune_bpf_program_run_seconds_total"]["on_sched_switch"])
    assert 0 < spent < ran * 20e-6          # a run takes ns, never tens of µs


def test_with_the_statistics_off_nothing_is_exported_and_start_up_says_so(kernel, stats, caplog):
    stats(False)
    with caplog.at_level(logging.INFO, logger="slotune.collectors.kernel.program_cost"):
        collector = kernel([ServiceSpec("x", cmdline="no-such-process-anywhere")], families=["runqueue"])
    said = [r.getMessage() for r in caplog.records if "bpf_stats_enabled" in r.getMessage()]
    assert len(said) == 1 and "is 0" in said[0] and "sysctl kernel.bpf_stats_enabled=1" in said[0]
    time.sleep(0.05)
    assert exported(collector) == {}
