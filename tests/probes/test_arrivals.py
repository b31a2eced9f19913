"""A service started after the collector is counted from its first request: its
process is watched as it execs (bpf/targeting.bpf.c, arrivals.py), not at the
rescan that ends the interval it started in, which used to lose that interval.
The Go server starts its threads at once, before slotune can see them. Between
the daemon's rescans (every RESCAN_S) the exec watch alone finds it."""
import urllib.request

from slotune.model.service import ServiceSpec
from tests.probes.conftest import collected, hist
from tests.probes.test_tls import make_cert
from tests.probes.test_tls_records import go_server, s_time

REQUESTS = 15


def test_a_server_started_after_the_collector_counts_from_its_first_request(kernel, spawn, tag):
    collector = kernel([ServiceSpec("web", cmdline=f"http_server.py {tag}")], ["http"])
    assert collected(collector)["web"].gauges[("processes", "")] == 0
    server = spawn("http_server", tag, 0.0)              # after the collector: no rescan in between
    port = int(server.stdout.readline())
    for _ in range(REQUESTS):
        assert urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10).read() == b"ok\n"
    first = collected(collector)["web"]
    assert hist(first.histograms, ("http_request", "")).count == REQUESTS


def test_between_rescans_the_exec_watch_alone_finds_a_new_server(kernel, spawn, tag):
    collector = kernel([ServiceSpec("web", cmdline=f"http_server.py {tag}")], ["http"], rescan_s=3600.0)
    scanned = collector.scanned_at
    collected(collector)
    server = spawn("http_server", tag, 0.0)
    port = int(server.stdout.readline())
    for _ in range(REQUESTS):
        assert urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10).read() == b"ok\n"
    second = collected(collector)["web"]
    assert collector.scanned_at == scanned            # no rescan since the start's
    assert hist(second.histograms, ("http_request", "")).count == REQUESTS


def test_a_go_server_started_after_the_collector_counts_every_handshake(kernel, started, tmp_path):
    binary = go_server(tmp_path)
    cert, key = make_cert(tmp_path)
    collector = kernel([ServiceSpec("go", cmdline=f"^{binary} ")], ["tls"])
    collected(collector)
    server = started([binary, cert, key])
    port = int(server.stdout.readline())
    [new] = s_time(port, "-new")
    h = hist(collected(collector)["go"].histograms, ("tls_handshake", ""))
    print(f"s_time -new: {new} connections; first interval: {h.count} handshakes")
    assert h.count == new
