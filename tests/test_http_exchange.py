"""daemon/host/http_exchange.py keeps a GET's connection for the next GET to the
same place, counted by nginx itself (stub_status: connections accepted beside
requests): kept while nginx keeps it, dropped when nginx closes it (idle, or
after its last request on it) and never used for a push. Two scripted servers do
what nginx does not: close a kept connection as the next request arrives, and
send bytes after an answer; the GET after still gets its own answer."""
from __future__ import annotations

import re
import socket
import threading
import time
from contextlib import contextmanager

import pytest

from slotune.host.http_exchange import TooLarge, exchange
from tests.actuators.real_servers import nginx

ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok"


def status_counts(port: int) -> tuple[int, int]:
    """(connections accepted, requests) from nginx's stub_status, read over the kept connection."""
    status, _, body = exchange(f"http://127.0.0.1:{port}/nginx_status", timeout_s=2.0, max_bytes=4096)
    assert status == 200
    accepts, _, requests = re.search(rb"\s(\d+) (\d+) (\d+)\s", body).groups()
    return int(accepts), int(requests)


def test_gets_to_nginx_share_one_connection_and_a_push_gets_its_own(tmp_path):
    with nginx(tmp_path / "nginx", "") as ng:
        accepts0, requests0 = status_counts(ng.port)
        for _ in range(5):
            status_counts(ng.port)
        accepts, requests = status_counts(ng.port)
        assert (accepts - accepts0, requests - requests0) == (0, 6)
        status, _, _ = exchange(f"http://127.0.0.1:{ng.port}/nginx_status", "PATCH", b"{}",
                                timeout_s=2.0, max_bytes=4096)
        assert status == 405                 # a push opens a connection of its own, and closes it
        assert status_counts(ng.port)[0] - accepts == 1


def test_a_connection_nginx_closed_is_not_used(tmp_path):
    with nginx(tmp_path / "nginx", "keepalive_timeout 300ms;\nkeepalive_requests 3;") as ng:
        accepts0, _ = status_counts(ng.port)
        time.sleep(0.6)                      # nginx closes the idle connection
        assert status_counts(ng.port)[0] - accepts0 == 1
        accepts1, _ = status_counts(ng.port)
        for _ in range(4):                   # nginx says "Connection: close" on the 3rd request of each
            status_counts(ng.port)
        assert status_counts(ng.port)[0] - accepts1 == 2


@contextmanager
def scripted(answer_connection):
    """A loopback server that hands each accepted connection to answer_connection(sock, nth)."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted = []

    def serve():
        while True:
            try:
                sock, _ = listener.accept()
            except OSError:
                return
            accepted.append(sock)
            threading.Thread(target=answer_connection, args=(sock, len(accepted)), daemon=True).start()
    threading.Thread(target=serve, daemon=True).start()
    try:
        yield listener.getsockname()[1], accepted
    finally:
        listener.close()
        for sock in accepted:
            sock.close()


def read_request(sock) -> bool:
    data = b""
    while b"\r\n\r\n" not in data:
        try:
            chunk = sock.recv(4096)
        except OSError:                  # the client dropped it, or the test is over and closed it
            return False
        if not chunk:
            return False
        data += chunk
    return True


def test_a_get_whose_kept_connection_closes_as_it_is_sent_goes_again_on_a_new_one():
    def first_answers_once_then_closes(sock, nth):
        while read_request(sock):
            sock.sendall(ANSWER)
            if nth == 1:
                read_request(sock)           # the next request arrives on the kept connection...
                sock.close()                 # ...and the server closes it without an answer
                return
    with scripted(first_answers_once_then_closes) as (port, accepted):
        url = f"http://127.0.0.1:{port}/x"
        assert exchange(url, timeout_s=2.0, max_bytes=100)[::2] == (200, b"ok")
        assert exchange(url, timeout_s=2.0, max_bytes=100)[::2] == (200, b"ok")
        assert len(accepted) == 2


def test_bytes_after_an_answer_drop_the_connection_and_are_never_read_as_the_next():
    def answers_with_more(sock, nth):
        while read_request(sock):
            sock.sendall(ANSWER)
            if nth == 1:                     # after the answer was read: the kept connection has bytes
                time.sleep(0.05)
                sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nforged")
    with scripted(answers_with_more) as (port, accepted):
        url = f"http://127.0.0.1:{port}/x"
        assert exchange(url, timeout_s=2.0, max_bytes=100)[::2] == (200, b"ok")
        time.sleep(0.1)
        assert exchange(url, timeout_s=2.0, max_bytes=100)[::2] == (200, b"ok")
        assert len(accepted) == 2


def test_an_answer_over_the_cap_closes_its_connection():
    def big(sock, nth):
        while read_request(sock):
            sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 300\r\n\r\n" + b"x" * 300)
    with scripted(big) as (port, accepted):
        url = f"http://127.0.0.1:{port}/x"
        for _ in range(2):
            with pytest.raises(TooLarge):
                exchange(url, timeout_s=2.0, max_bytes=100)
        assert len(accepted) == 2
