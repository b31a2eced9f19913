"""The http and tls families on a kernel without the socket layer's tracepoints
(before Linux 6.4, or without BTF): built on the socket syscalls' exits instead,
connections keyed by (process, fd), the same checks against the same
independent references, run here with the socket tracepoints declared absent.
The tests are the ones the socket layer passes, imported whole."""
import pytest

from slotune.collectors.kernel import sockets
from tests.probes.test_http import test_request_latency_median_and_exact_count  # noqa: F401
from tests.probes.test_http_routes import (  # noqa: F401
    test_counts_and_latency_by_route_and_the_window_judges_the_routes_alone)
from tests.probes.test_http_streaming import private_host, test_nginx_echo_chunks  # noqa: F401
from tests.probes.test_tls_records import (test_nginx_ssl,  # noqa: F401
                                           test_openssl_s_server_www_and_plaintext_beside_it,
                                           test_tls_started_after_a_plaintext_exchange)


@pytest.fixture(autouse=True)
def syscall_exits(monkeypatch):
    monkeypatch.setattr(sockets, "tracepoints_present", lambda: False)
    sockets.layout.cache_clear()
    assert sockets.layout() == {"SOCK_LAYER": 0}
    assert "syscalls:sys_exit_writev" in dict(sockets.syscall_points()) and not sockets.points()
    yield
    monkeypatch.undo()
    sockets.layout.cache_clear()
