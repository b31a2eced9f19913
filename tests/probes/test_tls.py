"""TLS from a Python ssl client and server: N handshakes (timed from the records
on their sockets) are N on both sides, their latency agrees with the client's own
clock, bytes (from uprobes on the libssl they load) are exact; a plaintext
client with libssl loaded shows none, and the HTTP request probe does not take
TLS records for requests."""
import json
import statistics
import subprocess

from slotune.model.service import ServiceSpec
from tests.probes.agreement import record
from tests.probes.conftest import collected, hist

HANDSHAKES = 20
PAYLOAD = 5000


def make_cert(tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", key, "-out", cert, "-subj", "/CN=localhost", "-days", "1"],
                   check=True, capture_output=True)
    return cert, key


def test_handshakes_and_bytes_counted_plaintext_none(kernel, spawn, tag, tmp_path):
    cert, key = make_cert(tmp_path)
    server = spawn("tls_pair", "server", f"{tag}-s", cert, key)
    tls_port = int(server.stdout.readline())
    http = spawn("http_server", tag, 0.0)
    http_port = int(http.stdout.readline())
    client = spawn("tls_pair", "client", f"{tag}-c", tls_port, HANDSHAKES, PAYLOAD, "tls")
    plain = spawn("tls_pair", "client", f"{tag}-p", http_port, HANDSHAKES, 0, "plain")
    collector = kernel([ServiceSpec("client", cmdline=f"client {tag}-c"),
                        ServiceSpec("server", cmdline=f"server {tag}-s"),
                        ServiceSpec("plain", cmdline=f"client {tag}-p")], ["tls", "http"])
    collected(collector)
    for p in (client, plain):
        p.stdin.write("go\n")
        p.stdin.flush()
    own_clock = json.loads(client.stdout.readline())
    assert json.loads(plain.stdout.readline()) == []
    samples = collected(collector)
    attached = [p for p, ok in collector.attached.items() if ok and "libssl" in p]
    assert len(attached) >= 8, collector.attached       # 4 functions, entry and return

    c, s = samples["client"], samples["server"]
    handshake = hist(c.histograms, ("tls_handshake", ""))
    assert handshake.count == HANDSHAKES
    assert hist(s.histograms, ("tls_handshake", "")).count == HANDSHAKES
    ours, theirs = handshake.quantile(0.5), statistics.median(own_clock)
    print(f"handshake p50: probe {ours * 1e3:.2f} ms, client's clock {theirs * 1e3:.2f} ms")
    # The records start with the ClientHello on the wire; the client's clock also holds the
    # work before it (building the ClientHello and its key share): 16-18 % of it here.
    record("TLS handshakes (Python ssl over libssl)", "the client's own count", handshake.count, HANDSHAKES,
           "handshakes", "exact")
    record("TLS handshake P50 (Python ssl)", "the client's own clock around do_handshake", ours * 1e3,
           theirs * 1e3, "ms", "0.6x to 1.1x (the client's clock also holds building the ClientHello)")
    assert 0.6 * theirs <= ours <= 1.1 * theirs
    assert c.counters[("tls_bytes", "write")] == HANDSHAKES * (8 + PAYLOAD)
    assert c.counters[("tls_bytes", "read")] == HANDSHAKES * 2
    assert s.counters[("tls_bytes", "read")] == HANDSHAKES * (8 + PAYLOAD)
    assert c.counters[("tls_calls", "write")] >= HANDSHAKES
    assert not any(sig.startswith("tls") for sig, _ in [*samples["plain"].histograms, *samples["plain"].counters])
    assert ("http_request", "") not in s.histograms       # the TLS server read 20 ClientHellos
