"""`slotune discover` on this host with real servers started by the test: HAProxy
(its Prometheus exporter), nginx (stub_status), Redis and the reference stack's
inference server behind the HAProxy. Each is listed with its profile, and the
config written for them loads with daemon.config.load as it is; HAProxy's frontend
gets its runtime API and maxconn target from its own haproxy.cfg. That config's
reading (daemon/profiles/haproxy_config.py) is checked on configs the test writes
and real HAProxy accepts (`haproxy -c`): one file, a directory of *.cfg, a missing
file and a link out of the directory, each of the last two refused with a hint."""
import os
import socket
import subprocess
import sys
import time
from urllib.parse import urlsplit

import pytest

from slotune import config
from slotune.commands import discover as discover_command
from slotune.profiles import haproxy_config
from reference_stack import launcher
from reference_stack.engine import proxy
from tests.actuators import real_servers
from tests.conftest import ROOT
from tests.stack.conftest import one_service


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def inference_port(tmp_path):
    port = free_port()
    args = ["inference", "--port", str(port), "--run-dir", str(tmp_path / "stack"), *launcher.SMALL_MODEL]
    with one_service(args, f"http://127.0.0.1:{port}/healthz"):
        yield port


def discover(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "slotune.cli", "discover", "--timeout", "2", *args],
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
        # its proxying frontend passes /metrics on to the inference server: that page is not taken as HAProxy's,
        # the exporter its own process serves on another port is
        assert (table[lb.port]["PROFILE"], table[lb.port]["METRICS"]) == ("haproxy", lb.metrics_url)
        assert (web_row["PROFILE"], web_row["METRICS"]) == ("nginx", f"http://127.0.0.1:{web.port}/nginx_status")
        assert (llm_row["PROFILE"], llm_row["METRICS"]) == ("reference", f"http://127.0.0.1:{inference_port}/metrics")
        assert llm_row["NAME"].startswith("inference")
        assert redis_row["NAME"].startswith("redis") and redis_row["PROFILE"] == "-"
        assert "http" not in redis_row["PROBES"].split(",") and "http" in web_row["PROBES"].split(",")
        assert "tcp" in redis_row["PROBES"].split(",")

        written = tmp_path / "slotune.toml"
        # by port: other tests' servers may come and go between the two looks, and names with them
        picks = [str(p) for p in (lb.port, stats_port, web.port, inference_port, redis_port)]
        wrote = discover("--pick", ",".join(picks), "--slo-ms", "750", "--write", str(written))
        assert wrote.returncode == 0, wrote.stderr
    cfg = config.load(written)
    by_port = {s.spec.port: s.spec for s in cfg.services}
    assert set(by_port) == {lb.port, stats_port, web.port, inference_port, redis_port}
    assert {s.spec.slo_p99_s for s in cfg.services} == {0.75}
    front = next(s for s in cfg.services if s.spec.port == lb.port)   # tuned as its own haproxy.cfg says
    assert (front.control.kind, front.control.options["address"]) == ("haproxy", lb.socket)
    assert front.control.targets == {"concurrency_limit": "maxconn server be_app/app"}
    assert [t.name for t in front.tuners] == ["throttle"] and front.spec.metrics_url == lb.metrics_url
    assert front.settings["concurrency_limit"].max == 64 and front.settings["concurrency_limit"].integer
    assert by_port[stats_port].profile == "haproxy" and by_port[stats_port].metrics_url == lb.metrics_url
    assert by_port[web.port].profile == "nginx"
    assert by_port[inference_port].latency_metric == "inference_request_duration_seconds"
    assert by_port[redis_port].metrics_url == ""
    stats = next(s for s in cfg.services if s.spec.port == stats_port)
    assert stats.control is None and "passes requests to no backend" in written.read_text()
    again = discover("--pick", str(redis_port), "--write", str(written))       # Redis still runs
    assert again.returncode == 1 and "exists" in again.stderr


GLOBAL = """global
    stats socket {folder}/ops.sock mode 600 level operator
    stats socket ipv4@127.0.0.1:19999 level admin
    maxconn 500
defaults
    mode http
    timeout connect 1s
    timeout client 5s
    timeout server 5s
"""
PROXIES = """frontend fe_one
    bind 127.0.0.1:18080
    default_backend be_one
frontend fe_many   # two backends, one of several servers: its own maxconn is the limit
    bind 127.0.0.1:18081,127.0.0.1:18090-18091
    maxconn 300
    use_backend be_one if { path_beg /one }
    default_backend be_many
frontend fe_stats
    bind 127.0.0.1:18404
    http-request use-service prometheus-exporter
backend be_one
    server app 127.0.0.1:9000 maxconn 12
backend be_many
    server-template s 3 127.0.0.1:9001 maxconn 4
listen li_one
    bind 127.0.0.1:18600
    server only 127.0.0.1:9002
    default-server maxconn 9     # for the servers after it only
"""
OUTSIDE = """frontend fe_out
    bind 127.0.0.1:18500
    default_backend be_one
"""


def accepted_by_haproxy(*args: str) -> None:
    """The config the test wrote is one real HAProxy takes (`haproxy -c` parses without binding)."""
    check = subprocess.run([proxy.HAPROXY, "-c", *args], capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stdout + check.stderr


def write_starter(tmp_path, listener) -> tuple[str, config.Config]:
    """discover's starter config for one listener, and that config as slotune run loads it."""
    text = discover_command.starter([listener], slo_ms=800)
    (tmp_path / "slotune.toml").write_text(text)
    return text, config.load(tmp_path / "slotune.toml")


def test_haproxy_config_gives_the_runtime_api_and_the_limit_of_each_port(tmp_path):
    (tmp_path / "haproxy.cfg").write_text(GLOBAL.format(folder=tmp_path) + PROXIES)
    accepted_by_haproxy("-f", str(tmp_path / "haproxy.cfg"))
    cfg = haproxy_config.read(["-W", "-db", "-f", "haproxy.cfg"], str(tmp_path))   # relative to its directory
    assert cfg.files == [str(tmp_path / "haproxy.cfg")] and cfg.hints == []
    admin = haproxy_config.StatsSocket("127.0.0.1:19999", "admin")
    assert cfg.sockets == [haproxy_config.StatsSocket(f"{tmp_path}/ops.sock", "operator"), admin]
    assert haproxy_config.admission(cfg, 18080) == haproxy_config.Admission(admin, "maxconn server be_one/app", 12)
    assert haproxy_config.admission(cfg, 18091) == haproxy_config.Admission(admin, "maxconn frontend fe_many", 300)
    with pytest.raises(haproxy_config.Unknown, match="server li_one/only has no maxconn"):
        haproxy_config.admission(cfg, 18600)
    with pytest.raises(haproxy_config.Unknown, match="fe_stats .* passes requests to no backend"):
        haproxy_config.admission(cfg, 18404)
    with pytest.raises(haproxy_config.Unknown, match="no frontend or listen section binds port 18500"):
        haproxy_config.admission(cfg, 18500)


def test_haproxy_config_directory_reads_its_cfg_files_and_refuses_a_link_out(tmp_path):
    folder, outside = tmp_path / "haproxy.d", tmp_path / "elsewhere"
    folder.mkdir()
    outside.mkdir()
    (folder / "10-global.cfg").write_text(GLOBAL.format(folder=tmp_path))
    (folder / "20-proxies.cfg").write_text(PROXIES)
    (folder / ".30-hidden.cfg").write_text(OUTSIDE)      # hidden: HAProxy skips it, so does discover
    (folder / "README").write_text("not a .cfg\n")
    (outside / "out.cfg").write_text(OUTSIDE)
    os.symlink(outside / "out.cfg", folder / "40-out.cfg")
    accepted_by_haproxy("-f", str(folder))
    cfg = haproxy_config.read(["-f", str(folder)], "/")
    assert cfg.files == [str(folder / "10-global.cfg"), str(folder / "20-proxies.cfg")]
    assert len(cfg.hints) == 1 and f"{folder}/40-out.cfg links to {outside}/out.cfg, outside {folder}: not read" \
        in cfg.hints[0]
    assert haproxy_config.admission(cfg, 18080).target == "maxconn server be_one/app"
    with pytest.raises(haproxy_config.Unknown, match="binds port 18500"):    # fe_out was not read
        haproxy_config.admission(cfg, 18500)
    text, loaded = write_starter(tmp_path, discover_command.Listener(
        18080, 0, 1, "haproxy", "", profile="haproxy", name="front",
        admission=haproxy_config.admission(cfg, 18080), hints=cfg.hints))
    assert f"# haproxy's config: {folder}/40-out.cfg links to {outside}/out.cfg, outside {folder}: not read" in text
    assert loaded.services[0].control.targets == {"concurrency_limit": "maxconn server be_one/app"}
    # a file named on the command line is read wherever its link points: HAProxy was given it
    os.symlink(outside / "out.cfg", tmp_path / "named.cfg")
    named = haproxy_config.read(["-f", str(folder / "10-global.cfg"), "-f", str(tmp_path / "named.cfg"),
                                 "-f", str(folder / "20-proxies.cfg")], "/")
    assert named.hints == [] and haproxy_config.admission(named, 18500).target == "maxconn server be_one/app"


def test_an_unreadable_haproxy_config_is_a_hint_line_in_a_config_that_loads(tmp_path):
    cfg = haproxy_config.read(["-f", str(tmp_path / "gone.cfg")], "/")
    assert cfg.hints == [f"{tmp_path}/gone.cfg: No such file or directory: not read"]
    with pytest.raises(haproxy_config.Unknown, match="no `stats socket` in the global section of its config"):
        haproxy_config.admission(cfg, 18080)
    assert haproxy_config.named_files(["-W", "-db"], "/srv") == (["/etc/haproxy/haproxy.cfg"], "/srv")   # no -f
    front = discover_command.Listener(18080, 0, 1, "haproxy", "haproxy -f gone.cfg", profile="haproxy",
                                      name="front", hints=[*cfg.hints, "no `stats socket`: add one"])
    text, loaded = write_starter(tmp_path, front)
    assert f"# haproxy's config: {tmp_path}/gone.cfg: No such file or directory: not read" in text
    assert "# [services.front.control]" in text and loaded.services[0].control is None


def test_a_stats_socket_below_level_admin_is_written_with_a_comment(tmp_path):
    (tmp_path / "haproxy.cfg").write_text(GLOBAL.replace("level admin", "level user").format(folder=tmp_path)
                                          + PROXIES)
    accepted_by_haproxy("-f", str(tmp_path / "haproxy.cfg"))
    admission = haproxy_config.admission(haproxy_config.read(["-f", str(tmp_path / "haproxy.cfg")], "/"), 18091)
    assert admission.socket.level == "operator"      # the first, as none is at level admin
    text, loaded = write_starter(tmp_path, discover_command.Listener(
        18091, 0, 1, "haproxy", "", profile="haproxy", name="front", admission=admission))
    assert "# its stats socket is at level operator: `set maxconn` needs level admin" in text
    service = loaded.services[0]
    assert (service.control.options["address"], service.control.targets) == \
        (f"{tmp_path}/ops.sock", {"concurrency_limit": "maxconn frontend fe_many"})
    assert (service.settings["concurrency_limit"].max, service.spec.slo_p99_s) == (300, 0.8)


def test_an_engines_starter_judges_its_generating_paths_alone(tmp_path):
    text, loaded = write_starter(tmp_path, discover_command.Listener(
        8000, 0, 1, "python", "python -m vllm.entrypoints.openai.api_server", profile="vllm", name="llm",
        metrics_url="http://127.0.0.1:8000/metrics"))
    assert 'routes = ["/v1/chat/completions", "/v1/completions"]' in text
    assert loaded.services[0].spec.routes == ("/v1/chat/completions", "/v1/completions")


# A stand-in for an engine with workers (vLLM's API server and its engine processes): the
# parent serves a /metrics page with vLLM's family names on one port; its child listens on two
# loopback ports and never answers, as the workers' ZMQ and torch.distributed sockets do.
ENGINE = """
import socket, subprocess, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
PAGE = b"# TYPE vllm:num_requests_running gauge\\nvllm:num_requests_running{model_name=\\"m\\"} 0.0\\n"
class Metrics(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", str(len(PAGE))); self.end_headers()
        self.wfile.write(PAGE)
    def log_message(self, *args):
        pass
CHILD = "import socket, time\\nfor _ in range(2):\\n    s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); print(s.getsockname()[1], flush=True); globals().setdefault('keep', []).append(s)\\ntime.sleep(600)"
server = HTTPServer(("127.0.0.1", 0), Metrics)
child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
ports = [child.stdout.readline().strip() for _ in range(2)]
print(server.server_port, *ports, flush=True)
server.serve_forever()
"""


@pytest.fixture
def engine_with_workers():
    """(the engine's metrics port, its child's two silent loopback ports)."""
    proc = subprocess.Popen([sys.executable, "-c", ENGINE], stdout=subprocess.PIPE, text=True)
    try:
        api, *workers = map(int, proc.stdout.readline().split())
        yield api, workers
    finally:
        subprocess.run(["pkill", "-P", str(proc.pid)])
        proc.kill()
        proc.wait()


def test_a_services_own_workers_loopback_ports_are_left_out_unprobed(engine_with_workers):
    """vLLM's 13 worker ports were listed as services and each sent GETs (28 s at --timeout 2)."""
    api, workers = engine_with_workers
    listed = discover("--timeout", "5")
    assert listed.returncode == 0, listed.stderr
    table = rows(listed.stdout)
    assert table[api]["PROFILE"] == "vllm" and not set(workers) & set(table)
    left_out = next(line for line in listed.stdout.splitlines() if line.startswith("left out:"))
    assert f"({', '.join(map(str, sorted(workers)))})" in left_out and "--internal" in left_out
    # --internal probes them too (each waits out --timeout: they never answer) and lists them
    every = discover("--timeout", "0.5", "--internal")
    assert set(workers) <= set(rows(every.stdout)) and "left out:" not in every.stdout


def test_probing_stops_when_its_budget_is_spent():
    """Ports that accept and never answer cost a probe's whole timeout each: 4 of them at
    --timeout 3 would take 12 s; --budget 2 ends the probing near 2 s and says what it left."""
    silent = [socket.create_server(("127.0.0.1", 0)) for _ in range(4)]
    ports = [s.getsockname()[1] for s in silent]
    try:
        started = time.monotonic()
        out = discover("--timeout", "3", "--budget", "2")
        took = time.monotonic() - started
    finally:
        for s in silent:
            s.close()
    assert "not probed:" in out.stdout and "the 2 s budget was spent" in out.stdout, out.stdout + out.stderr
    assert took < 2 + 3 + 4, took          # the budget, a probe at most, and the command's own start
    listed = rows(out.stdout)
    assert all(port in listed for port in ports)          # still listed, by process
