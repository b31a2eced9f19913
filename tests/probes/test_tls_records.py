"""TLS handshakes timed from the records on the services' sockets, counted
exactly against what each reference reports: `openssl s_server -www` (its
handshake driven by the first read through a BIO, which SSL_do_handshake never
sees) under `openssl s_time -www`, a Go crypto/tls server (no libssl at all)
and nginx with ssl; Python's ssl is tests/probes/test_tls.py, and here once more
with TLS started after a plaintext exchange (STARTTLS). A plaintext HTTP
service beside them counts none."""
import re
import shutil
import socket
import subprocess
import time
import urllib.request

import pytest

from slotune.model.service import ServiceSpec
from tests.probes.agreement import record
from tests.probes.conftest import WORKERS, collected, hist
from tests.probes.test_tls import make_cert

KEY = ("tls_handshake", "")
PLAIN_REQUESTS = 20
STARTTLS_CONNECTIONS = 10


def s_time(port: int, *mode: str) -> list[int]:
    """Connections `openssl s_time -www /` made, one figure per phase it ran
    (-new: new sessions; -reuse: resumed ones, after one first connection it
    does not count, which gets the session)."""
    out = subprocess.run(["openssl", "s_time", "-connect", f"127.0.0.1:{port}", "-www", "/", *mode, "-time", "1"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    return [int(n) for n in re.findall(r"^(\d+) connections in \d+ real seconds", out, re.M)]


def handshakes(sample) -> int:
    h = hist(sample.histograms, KEY)
    print(f"{sample.service}: {h.count} handshakes, p50 {h.quantile(0.5) * 1e3:.3f} ms, "
          f"p99 {h.quantile(0.99) * 1e3:.3f} ms")
    return h.count


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_openssl_s_server_www_and_plaintext_beside_it(kernel, spawn, started, tag, tmp_path):
    cert, key = make_cert(tmp_path)
    server = started(["openssl", "s_server", "-accept", "127.0.0.1:0", "-cert", cert, "-key", key, "-www"])
    port = int(next(line for line in server.stdout if line.startswith("ACCEPT")).rsplit(":", 1)[1])
    plain = spawn("http_server", tag, 0.0)
    plain_port = int(plain.stdout.readline())
    collector = kernel([ServiceSpec("s_server", cmdline=f"s_server .*{tmp_path}"),
                        ServiceSpec("plain", cmdline=f"http_server.py {tag}")], ["tls", "http"])
    collected(collector)
    [new] = s_time(port, "-new")
    for _ in range(PLAIN_REQUESTS):
        assert urllib.request.urlopen(f"http://127.0.0.1:{plain_port}/", timeout=10).read() == b"ok\n"
    samples = collected(collector)
    print(f"s_time -new: {new} connections")
    counted = handshakes(samples["s_server"])
    record("TLS handshakes, openssl s_server -www", "openssl s_time -new: connections", counted, new,
           "handshakes", "exact")
    assert counted == new
    assert KEY not in samples["plain"].histograms
    assert hist(samples["plain"].histograms, ("http_request", "")).count == PLAIN_REQUESTS
    [reused] = s_time(port, "-reuse")
    print(f"s_time -reuse: {reused} connections, and the one that got the session")
    assert handshakes(collected(collector)["s_server"]) == reused + 1


def go_server(tmp_path):
    """workers/tls_server.go built in tmp_path, offline, from Go's standard library."""
    if not shutil.which("go"):
        pytest.skip("no go toolchain (apt-get install golang; scripts/setup.sh installs it)")
    binary = tmp_path / "tls_server"
    subprocess.run(["go", "build", "-o", binary, WORKERS / "tls_server.go"], check=True, capture_output=True,
                   env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "GOCACHE": str(tmp_path / "gocache"),
                        "GOPATH": str(tmp_path / "gopath"), "GO111MODULE": "off"}, timeout=300)
    return binary


def test_go_crypto_tls_server(kernel, started, tmp_path):
    binary = go_server(tmp_path)
    cert, key = make_cert(tmp_path)
    server = started([binary, cert, key])
    port = int(server.stdout.readline())
    collector = kernel([ServiceSpec("go", cmdline=f"^{binary} ")], ["tls"])
    collected(collector)
    phases = s_time(port)
    server.stdin.write("count\n")
    server.stdin.flush()
    own = int(server.stdout.readline())
    print(f"s_time: {phases} connections (new, reused), the Go server's own count {own}")
    assert own == sum(phases) + 1
    counted = handshakes(collected(collector)["go"])
    record("TLS handshakes, Go crypto/tls (no libssl)", "the Go server's own count", counted, own, "handshakes",
           "exact")
    assert counted == own


def test_nginx_ssl(kernel, started, tmp_path):
    if not shutil.which("nginx"):
        pytest.skip("no nginx (apt-get install nginx-light; scripts/setup.sh installs it)")
    cert, key = make_cert(tmp_path)
    port = free_port()
    conf = tmp_path / "nginx.conf"
    conf.write_text(f"""
user root;
worker_processes 1;
daemon off;
pid {tmp_path}/nginx.pid;
error_log {tmp_path}/error.log;
events {{ worker_connections 1024; }}
http {{
    access_log {tmp_path}/access.log;
    server {{
        listen 127.0.0.1:{port} ssl;
        ssl_certificate {cert};
        ssl_certificate_key {key};
        location / {{ return 200 "ok\\n"; }}
    }}
}}
""")
    started(["nginx", "-p", tmp_path, "-e", tmp_path / "error.log", "-c", conf])
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.05)
    collector = kernel([ServiceSpec("nginx", port=port)], ["tls"])
    collected(collector)
    (tmp_path / "access.log").write_text("")
    phases = s_time(port)
    samples = collected(collector)
    requests = len((tmp_path / "access.log").read_text().splitlines())
    print(f"s_time: {phases} connections (new, reused); nginx's access log: {requests} requests")
    assert requests == sum(phases) + 1
    counted = handshakes(samples["nginx"])
    record("TLS handshakes, nginx ssl", "nginx's access log (one request per connection)", counted, requests,
           "handshakes", "exact")
    assert counted == requests


def test_tls_started_after_a_plaintext_exchange(kernel, spawn, tag, tmp_path):
    """PostgreSQL's way (SSLRequest, "S", then TLS): the connection is still waited on."""
    cert, key = make_cert(tmp_path)
    server = spawn("starttls", "server", f"{tag}-s", cert, key)
    port = int(server.stdout.readline())
    client = spawn("starttls", "client", f"{tag}-c", port, STARTTLS_CONNECTIONS)
    collector = kernel([ServiceSpec("server", cmdline=f"starttls.py server {tag}-s"),
                        ServiceSpec("client", cmdline=f"starttls.py client {tag}-c")], ["tls"])
    collected(collector)
    client.stdin.write("go\n")
    client.stdin.flush()
    assert client.stdout.readline().strip() == "done"
    samples = collected(collector)
    assert handshakes(samples["server"]) == STARTTLS_CONNECTIONS
    assert handshakes(samples["client"]) == STARTTLS_CONNECTIONS
