"""`slotune discover` on this host with real servers started by the test: HAProxy
(its Prometheus exporter), nginx (stub_status), Redis and the reference stack's
inference server behind the HAProxy. Each is listed with its profile, and the
config written for them loads with daemon.config.load as it is."""
import shutil
import socket
import subprocess
import sys
from urllib.parse import urlsplit

import pytest

from daemon import config
from reference_stack import launcher
from tests.actuators import real_servers
from tests.conftest import ROOT
from tests.stack.conftest import one_service


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def redis_port(tmp_path):
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (scripts/setup.sh installs it)")
    port = free_port()
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--save", "", "--appendonly", "no",
                             "--dir", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        real_servers._wait_port(port, proc, "redis-server")
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture
def inference_port(tmp_path):
    port = free_port()
    args = ["inference", "--port", str(port), "--run-dir", str(tmp_path / "stack"), *launcher.SMALL_MODEL]
    with one_service(args, f"http://127.0.0.1:{port}/healthz"):
        yield port


def discover(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "daemon.cli", "discover", "--timeout", "2", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


def rows(out: str) -> dict[int, dict[str, str]]:
    """The table's rows by port."""
    lines = out.split("\n\n")[0].splitlines()
    header = lines[0].split()
    return {int(r["PORT"]): r for r in (dict(zip(header, line.split())) for line in lines[1:])}


def test_discover_lists_each_with_its_profile_and_writes_a_config_that_loads(tmp_path, redis_port, inference_port):
    with real_servers.haproxy(tmp_path / "haproxy", inference_port) as lb, \
            real_servers.nginx(tmp_path / "nginx", "") as web:
        listed = discover()
        assert listed.returncode == 0, listed.stderr
        table = rows(listed.stdout)
        stats_port = urlsplit(lb.metrics_url).port
        lb_row, web_row = table[stats_port], table[web.port]
        llm_row, redis_row = table[inference_port], table[redis_port]
        assert (lb_row["PROFILE"], lb_row["METRICS"]) == ("haproxy", lb.metrics_url)
        # its proxying frontend passes /metrics on to the inference server: that page is not taken as HAProxy's
        assert (table[lb.port]["PROFILE"], table[lb.port]["METRICS"]) == ("haproxy", "-")
        assert (web_row["PROFILE"], web_row["METRICS"]) == ("nginx", f"http://127.0.0.1:{web.port}/nginx_status")
        assert (llm_row["PROFILE"], llm_row["METRICS"]) == ("reference", f"http://127.0.0.1:{inference_port}/metrics")
        assert llm_row["NAME"].startswith("inference")
        assert redis_row["NAME"].startswith("redis") and redis_row["PROFILE"] == "-"
        assert "http" not in redis_row["PROBES"].split(",") and "http" in web_row["PROBES"].split(",")
        assert "tcp" in redis_row["PROBES"].split(",")

        written = tmp_path / "slotune.toml"
        # by port: other tests' servers may come and go between the two looks, and names with them
        picks = [str(p) for p in (stats_port, web.port, inference_port, redis_port)]
        wrote = discover("--pick", ",".join(picks), "--write", str(written))
        assert wrote.returncode == 0, wrote.stderr
    cfg = config.load(written)
    by_port = {s.spec.port: s.spec for s in cfg.services}
    assert set(by_port) == {stats_port, web.port, inference_port, redis_port}
    assert by_port[stats_port].profile == "haproxy" and by_port[stats_port].metrics_url == lb.metrics_url
    assert by_port[web.port].profile == "nginx"
    assert by_port[inference_port].latency_metric == "inference_request_duration_seconds"
    assert by_port[redis_port].metrics_url == ""
    assert "maxconn server be_app/app" in written.read_text()          # the target, named from its exporter
    again = discover("--pick", str(redis_port), "--write", str(written))       # Redis still runs
    assert again.returncode == 1 and "exists" in again.stderr
