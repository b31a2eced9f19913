"""Service targeting: processes found by command line, systemd unit, cgroup path
and listening port; a restarted service is followed without restarting the
collector; tasks forked between scans join their service in the kernel at once."""
import http.client
import os
import time
from pathlib import Path

import pytest

from daemon.model.service import ServiceSpec
from daemon.collectors.kernel.targeting import Targeting, TargetingError
from tests.probes.conftest import collected, hist

CGROUP_V2 = Path("/sys/fs/cgroup/unified") if Path("/sys/fs/cgroup/unified/cgroup.procs").exists() \
    else Path("/sys/fs/cgroup")


def get(port):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/")
    assert conn.getresponse().read() == b"ok\n"
    conn.close()


def test_restarted_service_is_followed(kernel, spawn, tag):
    collector = kernel([ServiceSpec("web", cmdline=f"http_server.py {tag}")], ["http"])
    for round_ in range(2):                        # first start, then a restart
        server = spawn("http_server", tag, 0.01)
        port = int(server.stdout.readline())
        collector.refresh()                        # what each collection interval does
        collected(collector)
        for _ in range(5):
            get(port)
        sample = collected(collector)["web"]
        assert hist(sample.histograms, ("http_request", "")).count == 5, f"round {round_}"
        assert sample.gauges[("processes", "")] == 1
        server.kill()
        server.wait()
    collector.refresh()
    assert collected(collector)["web"].gauges[("processes", "")] == 0


def test_forks_and_threads_join_between_scans(kernel, spawn, tag):
    forker = spawn("forker", tag)
    assert forker.stdout.readline().strip() == "ready"
    collector = kernel([ServiceSpec("svc", cmdline=f"forker.py {tag}$")], ["runqueue"])
    watched = collector.program.table("watched")
    forker.stdin.write("go\n")
    forker.stdin.flush()
    thread, child = map(int, forker.stdout.readline().split())
    members = {k.value for k in watched.keys()}   # no rescan in between
    assert {forker.pid, thread, child} <= members
    other = spawn("forker", f"{tag}-other")       # not the service: stays out
    other.stdout.readline()
    collector.refresh()
    assert other.pid not in {k.value for k in watched.keys()}
    assert thread in collector.targets["svc"].tids    # the scan lists threads too
    assert collector.targets["svc"].tgids == {forker.pid, child}


def test_unit_cgroup_and_port_find_the_process(root_only, spawn, tag):
    group = CGROUP_V2 / f"{tag}.slice" / "web.service"
    group.mkdir(parents=True)
    server = spawn("http_server", tag, 0.0)
    try:
        port = int(server.stdout.readline())
        (group / "cgroup.procs").write_text(str(server.pid))
        specs = [ServiceSpec("by-unit", systemd_unit="web"),
                 ServiceSpec("by-cgroup", cgroup=str(group.parent)),
                 ServiceSpec("by-port", port=port),
                 ServiceSpec("all", cmdline=tag, port=port, cgroup=f"/{tag}.slice"),
                 ServiceSpec("wrong-port", cmdline=tag, port=1)]
        found = Targeting(specs).scan()
        for name in ("by-unit", "by-cgroup", "by-port", "all"):
            assert found[name].tgids == {server.pid}, name
        assert found["all"].listen_ports == {(os.stat("/proc/self/ns/net").st_ino, port)}
        assert found["wrong-port"].tgids == set()
    finally:
        server.kill()
        server.wait()
        for _ in range(50):
            try:
                group.rmdir()
                group.parent.rmdir()
                break
            except OSError:
                time.sleep(0.05)


@pytest.mark.parametrize("spec, words", [
    (ServiceSpec("x"), "no way to find its processes"),
    (ServiceSpec("x", cmdline="("), "not a valid regular expression"),
    (ServiceSpec("x", port=70000), "not a TCP port"),
])
def test_bad_declarations_say_what_to_fix(spec, words):
    with pytest.raises(TargetingError, match=words):
        Targeting([spec])
