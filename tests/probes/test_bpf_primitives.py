"""`python -m bench.bpf_primitives` as a user runs it: every primitive's program
loads into the running kernel and runs in the bench's own getppid() loop (a
program that never ran is refused by name), the table names each, and
kernel.bpf_stats_enabled, which the bench turns on, is as it was afterwards."""
import subprocess
import sys

from bench.bpf_primitives import PRIMITIVES
from slotune.collectors.kernel.program_cost import STATS_SYSCTL
from tests.conftest import ROOT


def test_every_primitive_is_timed_and_the_statistics_are_put_back(root_only):
    was = STATS_SYSCTL.read_text()
    out = subprocess.run([sys.executable, "-m", "bench.bpf_primitives", "--rounds", "1", "--seconds", "0.05"],
                         cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    for what, _ in PRIMITIVES.values():
        row = next(line for line in lines if what in line)
        assert row.split(what)[1].split()[0].replace(".", "").lstrip("-").isdigit(), row
    assert "exact counts" in out.stdout and "per-request timing" in out.stdout
    assert STATS_SYSCTL.read_text() == was
