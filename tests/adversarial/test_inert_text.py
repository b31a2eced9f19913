"""Text a service wrote, where a person reads it: the daemon's log lines stay one
line each with escapes shown, `slotune status` refuses an impostor on its port,
and an answer cut short of its Content-Length is no answer."""
import argparse
import http.client
import logging

import pytest

from slotune.commands import status
from slotune.host.http_exchange import exchange
from slotune.host.untrusted import InertFormatter
from tests.adversarial.conftest import reply


def test_a_log_line_quoting_a_service_stays_one_inert_line():
    record = logging.LogRecord("daemon.x", logging.WARNING, __file__, 1, "service api: %s", (
        "refused\n2026-12-06 00:00:00,000 ERROR daemon.process: forged\x1b[2J\u202e",), None)
    line = InertFormatter("%(levelname)s %(name)s: %(message)s").format(record)
    assert line == ("WARNING daemon.x: service api: refused\\n2026-12-06 00:00:00,000 ERROR daemon.process: "
                    "forged\\x1b[2J\\u202e")


@pytest.mark.parametrize("body", [b"[" * 100_000, b'{"services": []}', b"\xff\xfe", b"null"])
def test_status_names_an_impostor_on_the_daemons_port(serve, capsys, body):
    server = serve(reply(200, body))
    args = argparse.Namespace(url=f"http://127.0.0.1:{server.port}", once=True, every=2.0)
    assert status.run(args) == 1
    said = capsys.readouterr().err
    assert "is that the daemon's exporter_address?" in said and said.count("\n") == 1


def test_an_answer_cut_short_of_its_length_is_not_read_as_whole(serve):
    def short(conn, _request, _stopped):
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n# ten bytes")
    server = serve(short)
    with pytest.raises(http.client.IncompleteRead):
        exchange(f"http://127.0.0.1:{server.port}/metrics", timeout_s=2.0, max_bytes=1 << 20)
