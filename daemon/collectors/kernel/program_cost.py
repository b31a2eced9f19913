"""What each of slotune's BPF programs costs the host, as the kernel counts it: its
runs and the time spent in them (run_cnt, run_time_ns in the program's fdinfo),
exported as slotune_bpf_program_runs_total{program} and
slotune_bpf_program_run_seconds_total{program} when read. The kernel counts only
while kernel.bpf_stats_enabled is 1, which adds ~20-30 ns to every run of every
BPF program on the host, so slotune never turns it on: with it off the two are
not exported, and start-up says so in one line."""
from __future__ import annotations

import logging
from pathlib import Path

from prometheus_client.core import CounterMetricFamily

from slotune.collectors.kernel.program import fdinfo

log = logging.getLogger(__name__)

STATS_SYSCTL = Path("/proc/sys/kernel/bpf_stats_enabled")


def stats_enabled() -> bool | None:
    """kernel.bpf_stats_enabled, or None on a kernel without it (before 5.8)."""
    try:
        return STATS_SYSCTL.read_text().strip() != "0"
    except OSError:
        return None


def say_at_start() -> None:
    """The one start-up line when the kernel does not count the programs' runs."""
    enabled = stats_enabled()
    if enabled is None:
        log.info("BPF program cost: this kernel has no kernel.bpf_stats_enabled; "
                 "slotune_bpf_program_run_seconds_total is not exported")
    elif not enabled:
        log.info("BPF program cost: kernel.bpf_stats_enabled is 0, so the kernel does not time "
                 "slotune's programs and slotune_bpf_program_run_seconds_total is not exported; "
                 "`sysctl kernel.bpf_stats_enabled=1` shows what each costs (the kernel then "
                 "adds ~20-30 ns to every BPF program run on the host)")


def run_stats(fd: int) -> tuple[int, int] | None:
    """(run_time_ns, run_cnt) of a loaded program, None where its fdinfo has neither
    (a kernel before 5.1) or the program is closed."""
    try:
        fields = fdinfo(fd)
        return int(fields["run_time_ns"]), int(fields["run_cnt"])
    except (OSError, KeyError, ValueError):
        return None


class ProgramCost:
    """A prometheus_client collector (KernelCollector.metric_families()) over the
    program fds `fds()` gives (name -> fd; empty once the programs are closed)."""

    def __init__(self, fds):
        self.fds = fds

    def collect(self):
        read = {name: got for name, fd in self.fds().items() if (got := run_stats(fd)) is not None}
        if not read or (not stats_enabled() and not any(runs for _, runs in read.values())):
            return
        seconds = CounterMetricFamily("slotune_bpf_program_run_seconds",
                                      "Time the kernel spent running each slotune BPF program "
                                      "(counted while kernel.bpf_stats_enabled is 1)", labels=["program"])
        runs = CounterMetricFamily("slotune_bpf_program_runs",
                                   "Runs of each slotune BPF program (counted while "
                                   "kernel.bpf_stats_enabled is 1)", labels=["program"])
        for name, (ns, count) in sorted(read.items()):
            seconds.add_metric([name], ns / 1e9)
            runs.add_metric([name], count)
        yield seconds
        yield runs
