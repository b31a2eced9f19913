"""The daemon's own HTTP server under hostile clients: one thread however many
connect, idle and trickling clients dropped at their deadline, a bounded request
head, a scrape answered meanwhile, a taken port named with its holder, IPv6 literals."""
import http.client
import os
import socket
import threading
import time

import pytest
from prometheus_client import CollectorRegistry, Counter

from slotune import config
from slotune.export import server as exporter
from slotune.export.server import MetricsServer

STATUS = {"services": ["api"]}


def start(address="127.0.0.1:0", status=lambda: STATUS) -> MetricsServer:
    registry = CollectorRegistry()
    Counter("slotune_test_scrapes", "a counter to export", registry=registry).inc()
    host_port = config.Config(path="test.toml", exporter_address=address).exporter_host_port
    return MetricsServer(address, host_port, registry, status)


@pytest.fixture
def serve():
    started = []

    def make(**kwargs) -> MetricsServer:
        started.append(start(**kwargs))
        return started[-1]
    yield make
    for s in started:
        s.close()


@pytest.fixture
def clients():
    """connect(port, host) -> a client socket, closed at the end."""
    opened = []

    def connect(port, host="127.0.0.1"):
        opened.append(socket.create_connection((host, port), timeout=2))
        return opened[-1]
    yield connect
    for s in opened:
        s.close()


def get(port: int, path: str, host="127.0.0.1") -> tuple[int, bytes, float]:
    t0 = time.monotonic()
    conn = http.client.HTTPConnection(host, port, timeout=2)
    try:
        conn.request("GET", path)
        answer = conn.getresponse()
        return answer.status, answer.read(), time.monotonic() - t0
    finally:
        conn.close()


def wait_for(predicate, what: str, timeout_s: float = 5.0):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:.0f} s"
        time.sleep(0.01)


def closed_by_server(sock: socket.socket) -> bool:
    try:
        return sock.recv(1024) == b""
    except (BlockingIOError, socket.timeout):
        return False
    except ConnectionError:
        return True


def test_idle_and_trickling_clients_hold_no_thread_and_scrapes_still_answer(serve, clients):
    server = serve()
    threads = threading.active_count()
    for _ in range(200):
        clients(server.port)
    for _ in range(20):
        clients(server.port).sendall(b"GET /metrics HTTP/1.1\r\nX-Slow: ")
    wait_for(lambda: len(server.clients) == 220, "the server accepting 220 clients")

    assert threading.active_count() <= threads
    status, body, took = get(server.port, "/metrics")
    assert status == 200 and b"slotune_test_scrapes_total 1.0" in body and took < 1.0
    status, body, took = get(server.port, "/status")
    assert status == 200 and b'"api"' in body and took < 1.0


def test_a_client_trickling_its_headers_is_dropped_at_the_deadline(serve, clients, monkeypatch):
    monkeypatch.setattr(exporter, "DEADLINE_S", 0.5)
    server = serve()
    slow = clients(server.port)
    slow.settimeout(0.05)                       # the pace of the trickle: a byte each 50 ms
    t0, dropped = time.monotonic(), False
    while not dropped and time.monotonic() - t0 < 3.0:
        try:
            slow.send(b"X")
        except ConnectionError:
            dropped = True
        dropped = dropped or closed_by_server(slow)
    assert dropped, "a client still sending its headers after 3 s was not dropped"
    assert 0.4 < time.monotonic() - t0 < 2.0


def test_a_request_head_past_the_cap_is_refused(serve, clients):
    server = serve()
    big = clients(server.port)
    big.sendall(b"GET /metrics HTTP/1.0\r\nX-Big: " + b"a" * exporter.HEAD_BYTES)
    assert big.recv(1024).startswith(b"HTTP/1.0 431 ")


def test_a_client_past_the_cap_drops_the_oldest(serve, clients, monkeypatch):
    monkeypatch.setattr(exporter, "MAX_CLIENTS", 8)
    server = serve()
    oldest = clients(server.port)
    for _ in range(7):
        clients(server.port)
    wait_for(lambda: len(server.clients) == 8, "the server accepting 8 clients")

    assert get(server.port, "/metrics")[0] == 200
    oldest.settimeout(1.0)
    assert oldest.recv(1) == b""


def test_a_failing_status_answers_500_and_the_server_goes_on(serve):
    def broken():
        raise RuntimeError("status is broken")
    server = serve(status=broken)
    assert get(server.port, "/status")[0] == 500
    assert get(server.port, "/metrics")[0] == 200


def test_a_taken_port_is_named_with_its_holder_in_one_line():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(OSError) as refused:
            start(f"127.0.0.1:{port}")
    message = str(refused.value)
    assert "\n" not in message
    assert f"127.0.0.1:{port}" in message and f"pid {os.getpid()} (" in message
    assert "daemon.exporter_address" in message


def test_a_holder_that_cannot_be_found_is_said_so():
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))            # bound, never listening: no process listens on it
        assert "could not be found" in exporter.port_holder(bound.getsockname()[1])


def ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not ipv6_loopback(), reason="this host has no IPv6 loopback (::1) to bind")
def test_an_ipv6_literal_address_binds(serve):
    server = serve(address="[::1]:0")
    assert get(server.port, "/metrics", host="::1")[0] == 200
