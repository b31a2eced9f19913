"""The Prometheus baseline read against servers that answer badly on purpose: a
trickle, a body over the cap, a body cut short, deep JSON, odd shapes, redirects
and arbitrary bytes. Each ends within the read's deadline, and the only error out
is PrometheusError naming the URL (the daemon's tick catches only that)."""
from __future__ import annotations

import json
import time
from unittest import mock

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slotune.store import prometheus_history
from slotune.store.prometheus_history import MAX_ANSWER_BYTES, PrometheusError, PrometheusHistory
from tests.adversarial.answers import ANSWERS, FUZZ
from tests.adversarial.conftest import reply

TIMEOUT_S = 0.5


def answer_of(*series: dict) -> bytes:
    return json.dumps({"status": "success", "data": {"resultType": "matrix", "result": list(series)}}).encode()


GOOD = answer_of({"metric": {"deploy_id": "v1"}, "values": [[60, "0.25"], [120, "NaN"]]})


def read(url: str, timeout_s: float = TIMEOUT_S):
    return PrometheusHistory(url, timeout_s).query_range("up", 0, 120, 60)


def refused(server) -> PrometheusError:
    with pytest.raises(PrometheusError) as err:
        read(f"http://127.0.0.1:{server.port}")
    assert f"Prometheus at http://127.0.0.1:{server.port}, query up" in str(err.value)
    return err.value


def test_a_good_answer_reads(serve):
    server = serve(reply(200, GOOD))
    assert read(f"http://127.0.0.1:{server.port}") == [({"deploy_id": "v1"}, [(60.0, 0.25)])]


def trickle(conn, _request, stopped):
    """A whole good answer, one byte every 0.1 s."""
    head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(GOOD)}\r\n\r\n".encode()
    for byte in head + GOOD:
        if stopped.wait(0.1):
            return
        conn.sendall(bytes([byte]))


@pytest.mark.timeout(60)
def test_an_answer_at_a_byte_every_tenth_of_a_second_ends_at_the_deadline(serve):
    """A timeout on each read (urlopen's) would not bound the answer: ~9 s here against 0.5."""
    server = serve(trickle)
    start = time.monotonic()
    err = refused(server)
    assert time.monotonic() - start < TIMEOUT_S + 0.5
    assert f"no complete answer within {TIMEOUT_S:g} s" in str(err)


def oversized(with_length: bool):
    """A valid answer one label value past the cap, with or without a Content-Length."""
    body = answer_of({"metric": {"deploy_id": "v1", "note": "x" * MAX_ANSWER_BYTES}, "values": [[60, "1"]]})

    def answer(conn, _request, _stopped):
        length = f"Content-Length: {len(body)}\r\n" if with_length else ""
        conn.sendall(f"HTTP/1.1 200 OK\r\n{length}Connection: close\r\n\r\n".encode() + body)
    return answer


@pytest.mark.parametrize("with_length", [True, False], ids=["with-a-length", "without-a-length"])
@pytest.mark.timeout(60)
def test_an_answer_over_the_cap_is_refused(serve, with_length):
    err = refused(serve(oversized(with_length)))
    assert f"the answer is larger than {MAX_ANSWER_BYTES} bytes" in str(err)


def cut_short(conn, _request, _stopped):
    conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Length: {len(GOOD)}\r\n\r\n".encode() + GOOD[:20])


@pytest.mark.parametrize("answer, words", [
    (cut_short, "IncompleteRead(20 bytes read, 120 more expected)"),
    (reply(200, b'{"status": "success", "data": ' + b"[" * 100_000), "is nested deeper than 64 levels"),
    (reply(200, answer_of({"metric": "up", "values": []})), "metric is not an object of label -> string"),
    (reply(200, answer_of({"metric": {"deploy_id": ["v1"]}, "values": []})), "not an object of label -> string"),
    (reply(200, answer_of({"metric": {}, "values": {"12": "x"}})), "values are not a list"),
    (reply(200, b'{"status": "success", "data": {"result": [{"metric": {}, "values": [[1' + b"0" * 400
           + b', "1"]]}]}}'), "OverflowError"),
    (reply(200, answer_of({"metric": {}, "values": [[1e400, "1"]]})), "time is not a finite number"),
    (reply(200, b'{"status": "error", "error": "' + b"e" * 100_000 + b'"}'), "e" * 150),
    (reply(400, b'{"status": "error", "error": "1:5: parse error: unexpected"}'), "HTTP 400: 1:5: parse error"),
    (reply(503, b"<html>\n busy</html>"), "HTTP 503: <html> busy</html>"),
    (reply(302, b"", {"Location": "http://127.0.0.1:1/"}), "HTTP 302, a redirect to http://127.0.0.1:1/; slotune "
                                                           "follows no redirects"),
], ids=["cut-short", "deep", "labels-a-string", "a-label-a-list", "values-an-object", "a-400-digit-time",
        "an-infinite-time", "a-100-kB-error", "HTTP-400", "HTTP-503-html", "a-redirect"])
def test_each_bad_answer_is_a_prometheus_error_naming_what_came(serve, answer, words):
    err = refused(serve(answer))
    assert words in str(err) and len(str(err)) < 1000


@FUZZ
@given(answer=ANSWERS, status=st.sampled_from([200, 200, 302, 400, 503]))
def test_any_answer_gives_only_prometheus_errors(answer, status):
    with mock.patch.object(prometheus_history, "exchange", lambda *args, **kwargs: (status, "", answer)):
        try:
            PrometheusHistory("http://127.0.0.1:9").by_deploy("up", 0, 120, 60)
        except PrometheusError:
            pass
