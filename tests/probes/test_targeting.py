"""Service targeting: processes found by command line, systemd unit, cgroup path
and listening port; a restarted service is followed without restarting the
collector; tasks forked between scans join their service in the kernel at once."""
import http.client
import os
import socket
import time
from pathlib import Path

import pytest

from slotune.model.service import ServiceSpec
from slotune.collectors.kernel import targeting as targeting_module
from slotune.host.proc_clock import CLOCK_TICKS, uptime_s
from slotune.collectors.kernel.targeting import Targeting, TargetingError
from tests.probes.conftest import collected, hist

CGROUP_V2 = Path("/sys/fs/cgroup/unified") if Path("/sys/fs/cgroup/unified/cgroup.procs").exists() \
    else Path("/sys/fs/cgroup")


def older_than_a_walk(pid: int) -> None:
    """Returns once pid started before any walk from now would count it as started since
    (a walk's start is taken a second early)."""
    started = targeting_module.stat_identity(pid)[1]
    while uptime_s() * CLOCK_TICKS - CLOCK_TICKS <= started:
        time.sleep(0.05)


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


def nginx_workers(master: int) -> set[int]:
    return {int(t) for t in Path(f"/proc/{master}/task/{master}/children").read_text().split()}


def test_nginx_workers_are_followed_through_reloads(root_only, started, tmp_path):
    """A reload forks new workers, which inherit the listening socket (the listening
    sockets do not change) and drop to their user and rename themselves just after the
    fork: by port and by user + command line, every scan after a reload finds the new
    workers (and the master, for the port)."""
    import socket
    import subprocess
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    conf = tmp_path / "nginx.conf"
    conf.write_text(f"""
user nobody nogroup;
worker_processes 2;
daemon off;
pid {tmp_path}/nginx.pid;
error_log {tmp_path}/error.log;
events {{ worker_connections 64; }}
http {{
    access_log off;
    server {{ listen 127.0.0.1:{port}; location / {{ return 200 "ok\\n"; }} }}
}}
""")
    master = started(["nginx", "-p", tmp_path, "-e", tmp_path / "error.log", "-c", conf]).pid
    targeting = Targeting([ServiceSpec("by-port", port=port),
                           ServiceSpec("workers", user="nobody", cmdline="^nginx: worker process")])
    for reload in range(3):
        deadline = time.monotonic() + 10
        while len(workers := nginx_workers(master)) != 2 or any(
                Path(f"/proc/{w}/cmdline").read_bytes().startswith(b"nginx: master") for w in workers):
            assert time.monotonic() < deadline, f"nginx has no two workers after reload {reload}"
            time.sleep(0.05)
        get(port)
        found = targeting.scan()
        assert found["by-port"].tgids == {master} | workers, f"after {reload} reloads"
        # Any nginx's workers match this finder (another test's may still be exiting): ours must be in.
        assert workers <= found["workers"].tgids and master not in found["workers"].tgids, f"after {reload} reloads"
        subprocess.run(["nginx", "-p", tmp_path, "-c", conf, "-s", "reload"], check=True, capture_output=True)
        deadline = time.monotonic() + 10
        while nginx_workers(master) & workers:           # until the old workers have gone
            assert time.monotonic() < deadline, "the old workers never left"
            time.sleep(0.05)
        targeting.scan()                                  # a scan right after the fork, mid-change
    subprocess.run(["nginx", "-p", tmp_path, "-c", conf, "-s", "quit"], capture_output=True)   # workers too


def test_a_reload_with_the_same_services_keeps_what_the_scans_learned(spawn, tag):
    # A SIGHUP every second (the chaos bench) re-gave the same list each time, and each threw away
    # the cache of who listens where: every tick paid for a walk of every process's fds.
    server = spawn("http_server", tag, 0.01)
    port = int(server.stdout.readline())
    specs = [ServiceSpec("web", port=port)]
    targeting = Targeting(specs)
    assert server.pid in targeting.scan()["web"].tgids
    learned = targeting.seen
    targeting.update_services([ServiceSpec("web", port=port)])      # equal, as a reload reads it
    assert targeting.seen is learned and targeting.port_inodes is not None
    targeting.update_services([ServiceSpec("web", port=port, slo_p99_s=0.2)])
    assert targeting.seen == {} and targeting.port_inodes is None
    assert server.pid in targeting.scan()["web"].tgids


def test_a_new_listening_socket_is_looked_for_in_new_processes_first(spawn, tag, monkeypatch):
    # A service restarting beside processes that hold 100 000 idle connections: a walk of every
    # process's fds at each restart cost the tick seconds. Its new socket is in its new process.
    first = spawn("http_server", tag, 0.01)
    port = int(first.stdout.readline())
    targeting = Targeting([ServiceSpec("web", port=port)])
    assert first.pid in targeting.scan()["web"].tgids     # learns every listening socket's holder
    walked = []
    real = targeting_module.socket_inodes
    monkeypatch.setattr(targeting_module, "socket_inodes", lambda pid: walked.append(pid) or real(pid))
    second = spawn("http_server", tag, 0.01)
    second.stdout.readline()
    new = targeting._started_since(targeting.walked_at)
    held, _, walked_all = targeting_module.still_held(targeting.own_held, targeting.unheld,
                                                      set(targeting_module.own_listening_table()), new)
    assert second.pid in held and first.pid in held and not walked_all
    everyone = [e for e in os.listdir("/proc") if e.isdigit()]
    assert second.pid in walked and sorted(walked) == sorted(new) and len(walked) < len(everyone) / 2


def test_a_process_is_asked_for_its_sockets_once_and_only_if_started_since_the_walk(spawn, tag, monkeypatch):
    # The chaos bench's start-up tick took 2.5 s: processes left unmatched by a scan over its
    # budget were matched again next scan as new, and each service with a port read the fds of
    # a process holding 16 000 connections again. A process the full walk saw is no worker
    # forked since; a new one is read once, whatever the number of services.
    server = spawn("http_server", tag, 0.01)
    port = int(server.stdout.readline())
    old = spawn("sleeper", f"{tag}-old", 1, 0.01, 0.0)
    older_than_a_walk(old.pid)
    specs = [ServiceSpec(f"web-{i}", port=port, cmdline=f"{tag}-{i}") for i in range(10)]
    targeting = Targeting(specs, scan_budget_s=0.0)
    targeting.scan()                             # over budget at once: the rest wait for the next scan
    assert old.pid not in targeting.seen and targeting.walked_at is not None
    walked = []
    real = targeting_module.socket_inodes
    monkeypatch.setattr(targeting_module, "socket_inodes", lambda pid: walked.append(pid) or real(pid))
    # The subject is a scan between walks: a port opened elsewhere on the host meanwhile (another
    # test run, any server starting) rightly makes the next scan walk every process.
    unchanged = targeting.listen_inodes
    monkeypatch.setattr(targeting_module, "listening_sockets", lambda tables: unchanged)
    targeting.scan_budget_s = 10.0
    new = spawn("sleeper", f"{tag}-new", 1, 0.01, 0.0)
    started = targeting_module.stat_identity(new.pid)[1]
    while uptime_s() * CLOCK_TICKS < started + \
            targeting_module.SETTLING_S * CLOCK_TICKS:
        time.sleep(0.05)                         # settled: matched (to no service) and kept
    targeting.scan()
    assert old.pid in targeting.seen and new.pid in targeting.seen
    assert old.pid not in walked and walked.count(new.pid) == 1


def test_our_own_new_listening_socket_costs_no_walk(spawn, tag, monkeypatch):
    # The daemon's exporter starts listening after its first scan; at the next change of the
    # host's listening sockets its socket, held by no new process, cost a walk of every
    # process's fds (1.7 s beside 100 000 idle connections in the chaos bench).
    first = spawn("http_server", tag, 0.01)
    port = int(first.stdout.readline())
    older_than_a_walk(os.getpid())
    targeting = Targeting([ServiceSpec("web", port=port)])
    assert first.pid in targeting.scan()["web"].tgids
    ours = socket.create_server(("127.0.0.1", 0))
    try:
        walked = []
        real = targeting_module.socket_inodes
        monkeypatch.setattr(targeting_module, "socket_inodes", lambda pid: walked.append(pid) or real(pid))
        second = spawn("http_server", tag, 0.01)          # a service restarted: a listening change
        second.stdout.readline()
        targeting.scan()
        everyone = [e for e in os.listdir("/proc") if e.isdigit()]
        assert second.pid in walked and len(walked) < len(everyone) / 2, (len(walked), len(everyone))
    finally:
        ours.close()
