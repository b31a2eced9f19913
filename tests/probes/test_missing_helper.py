"""A kernel without a BPF helper a family calls (bpf_task_pt_regs, which offcpu,
http and tls call, came in Linux 5.15) loses that family alone: offcpu is made
to call a helper id this kernel's verifier does not know, so the real check (libbpf asking the verifier)
finds it missing. Then runqueue, tcp and http load in one object, sched_switch
runs runqueue's own program, each counts what a real server and client did, and
the start-up log and `slotune doctor` each name offcpu, the helper and the kernel
in one line."""
import argparse
import http.client
import logging
import platform

import pytest

from slotune.collectors.kernel.helpers import Helper
from slotune.collectors.kernel.families.offcpu import OffCpu
from slotune.commands import doctor
from slotune.model.service import ServiceSpec
from tests.probes.conftest import collected, hist

REQUESTS = 10
SLEEP_S = 0.01
UNKNOWN = Helper("bpf_from_the_future", 100000, (99, 0))   # far past any kernel's last helper id


@pytest.fixture
def offcpu_needs_unknown_helper(monkeypatch):
    monkeypatch.setattr(OffCpu, "helpers", OffCpu.helpers + (UNKNOWN,))


def test_the_other_families_load_and_count(offcpu_needs_unknown_helper, kernel, spawn, tag, caplog):
    server = spawn("http_server", tag, SLEEP_S)
    port = int(server.stdout.readline())
    with caplog.at_level(logging.WARNING):
        collector = kernel([ServiceSpec("web", cmdline=f"http_server.py {tag}")],
                           ["runqueue", "offcpu", "tcp", "http"])
    said = [r.getMessage() for r in caplog.records if "offcpu" in r.getMessage()]
    print(said)
    assert len(said) == 1
    assert all(word in said[0] for word in ("offcpu probes", UNKNOWN.name, platform.release(), "Linux >= 99.0"))
    assert [f.name for f in collector.program.families] == ["http", "runqueue", "tcp"]
    assert "bpf/offcpu.bpf.c ----" not in collector.program.text
    assert "offcpu_since" not in collector.program.text          # offcpu's code left out
    assert collector.attached["sched:sched_switch"]

    collected(collector)
    for _ in range(REQUESTS):                      # a new connection each; the handler sleeps
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/")
        assert conn.getresponse().read() == b"ok\n"
        conn.close()
    sample = collected(collector)["web"]
    print(sorted(sample.histograms), sorted(sample.counters))
    assert hist(sample.histograms, ("http_request", "")).count == REQUESTS
    assert hist(sample.histograms, ("runqueue_wait", "")).count >= REQUESTS   # each wake-up from its sleep
    assert sum(v for (sig, _), v in sample.counters.items() if sig == "tcp_opened") == REQUESTS
    assert not [k for k in sample.histograms if k[0] == "offcpu"]


def test_doctor_says_offcpu_is_off(offcpu_needs_unknown_helper, root_only, capsys):
    assert doctor.run(argparse.Namespace(config=None, prometheus_url=None, redis_url=None)) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if "offcpu" in line]
    print(out)
    assert lines[0].startswith("✗ offcpu probes") and UNKNOWN.name in lines[0] and platform.release() in lines[0]
    assert "offcpu probes" in out.splitlines()[-1]       # listed as degraded, not fatal
