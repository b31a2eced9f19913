"""The daemon under faults, with real processes: its target's control API is
down; a change that hurts is rolled back; SIGHUP with a bad config keeps the
old one; a restarting service is followed; kill -9 and SIGTERM leave no BPF
program behind and the baseline store intact."""
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
import uuid

from slotune import config
from slotune.collectors.service_metrics import ServiceMetricsCollector
from slotune.process import Daemon
from reference_stack import launcher, loadgen
from tests.conftest import ROOT
from tests.e2e.conftest import daemon_config
from tests.probes.test_lifecycle import loaded, prog_ids_of
from slotune.tuners import throttle
from slotune.tuners.base import Decision, Policy

WORKER = ROOT / "tests" / "probes" / "workers" / "http_server.py"


def background_load(stack, rate, seconds, until=None):
    t = threading.Thread(target=loadgen.run_load, args=(stack.state["query_url"], rate, seconds),
                         kwargs={"until": until}, daemon=True)
    t.start()
    return t


def wait_for(predicate, timeout_s, what):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def test_control_api_down_keeps_observing_and_pushes_nothing(stack, daemon_factory, fresh_settings):
    dead = f"http://127.0.0.1:{launcher.free_ports(1)[0]}/admin/config"
    d = daemon_factory(lambda port, work: daemon_config(
        stack.state, port, work, gateway_slo_ms=50, control_url=dead,
        gateway_tuners="[services.gateway.tuners.throttle]\ninterval_s = 1.0\n"))
    background_load(stack, 10, 8).join()
    gateway = d.status()["services"]["gateway"]
    assert gateway["control_reachable"] is False
    assert gateway["rate_rps"] > 0 and gateway["p99_s"] is not None      # still observing
    assert not [e for e in d.audit() if e["outcome"] == "pushed"]
    assert d.log().count("control surface down") == 1                      # said once, not every retry
    assert "slotune_control_reachable{service=\"gateway\"} 0.0" in d.metrics()
    assert stack.settings("gateway")["concurrency_limit"] == 64


def harmful_policy():
    """A deliberately bad tuner (a stand-in for a tuner that gets it wrong): it turns on a
    setting that blocks the gateway's event loop, so the daemon must roll it back."""
    def decide(first_seen, obs):
        first_seen = obs.now if first_seen is None else first_seen
        if obs.now - first_seen < 4.0 or obs.completed_rps <= 0:   # let the daemon see a healthy P99 first
            return first_seen, Decision({}, "watching")
        return first_seen, Decision({"blocking_io_ms": 150.0}, "deliberately harmful test tuner")
    return Policy("harmful", "test only", lambda settings: None, decide)


def test_a_change_that_worsens_p99_is_rolled_back_within_two_intervals(stack, tmp_path, fresh_settings,
                                                                         monkeypatch):
    monkeypatch.setitem(throttle.POLICIES, "harmful", harmful_policy())
    port = launcher.free_ports(1)[0]
    (tmp_path / "slotune.toml").write_text(daemon_config(
        stack.state, port, tmp_path, gateway_slo_ms=250,
        gateway_tuners="[services.gateway.tuners.throttle]\npolicy = \"harmful\"\ninterval_s = 2.0\n")
        + "[services.gateway.settings.blocking_io_ms]\nmin = 0\nmax = 500\nmax_step = 500\n")
    cfg = config.load(tmp_path / "slotune.toml")
    daemon = Daemon(cfg, collectors=[ServiceMetricsCollector()])
    daemon.start()
    try:
        stop = threading.Event()      # set once a decision is held after the rollback: the outcome
        load = background_load(stack, 5, 18, until=stop)
        start = time.time()
        while load.is_alive():
            time.sleep(1.0)
            daemon.step(start, time.time())
            start = time.time()
            rolled = [e.t for e in daemon.audit.recent if e.outcome == "rolled back"]
            if rolled and any(e.outcome.startswith("held") and e.t > rolled[0] for e in daemon.audit.recent):
                stop.set()
        entries = list(daemon.audit.recent)
    finally:
        daemon.close()
    pushed = [e for e in entries if e.outcome == "pushed"]
    rolled = [e for e in entries if e.outcome == "rolled back"]
    assert pushed and rolled, [e.line() for e in entries]
    assert rolled[0].t - pushed[0].t <= 2 * 2.0 + 1.0         # within two tuning intervals (+ one window)
    assert rolled[0].new == 0.0
    assert "blocking_io_ms: 150.0 -> 0.0" in (stack.run_dir / "gateway.log").read_text()   # the stack saw it
    assert any(e.outcome.startswith("held") for e in entries if e.t > rolled[0].t)


def test_sighup_applies_a_good_config_and_refuses_a_bad_one(stack, daemon_factory):
    d = daemon_factory(lambda port, work: daemon_config(stack.state, port, work))
    path = d.work / "slotune.toml"
    good = path.read_text()
    path.write_text(good + "\n[services.extra]\ncmdline = \"no-such-process\"\n")
    d.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "extra" in d.status()["services"], 10, "the reloaded service list")
    path.write_text(good + "\n[services.extra]\ncmdline = \"x\"\ncolour = \"blue\"\n")
    d.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "config reload refused" in d.log(), 10, "the refusal in the log")
    assert "services.extra.colour: unknown key" in d.log()
    assert "extra" in d.status()["services"] and d.proc.poll() is None


def ebpf_only_config(tag):
    def config_for(port, work):
        return f"""
[daemon]
exporter_address = "127.0.0.1:{port}"
baseline_store = "{work}/baselines.sqlite"
audit_log = "{work}/audit.jsonl"
probes = ["http", "runqueue"]

[services.plain]
cmdline = "{tag}"
slo_p99_ms = 200
"""
    return config_for


def serve(tag):
    """A plain HTTP server with no metrics of its own (handler sleeps 20 ms); returns (proc, port)."""
    proc = subprocess.Popen([sys.executable, str(WORKER), tag, "0.02"], stdout=subprocess.PIPE, text=True)
    return proc, int(proc.stdout.readline())


def hit(port, n):
    for _ in range(n):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5).read()


def test_ebpf_only_service_is_followed_across_a_restart(root_only, daemon_factory):
    tag = f"slotune-e2e-{uuid.uuid4().hex[:8]}"
    d = daemon_factory(ebpf_only_config(tag))
    server, port = serve(tag)
    try:
        def answered():
            hit(port, 10)
            s = d.status()["services"]["plain"]
            return s["latency_source"] == "ebpf" and s["rate_rps"] > 0 and s
        seen = wait_for(answered, 15, "eBPF request latency of the plain server")
        assert 0.015 < seen["p50_s"] < 0.05                       # the handler's 20 ms
        server.kill()
        server.wait()
        server, port = serve(tag)                                 # same service, new process
        wait_for(answered, 6, "the restarted server's requests")
    finally:
        server.kill()
        server.wait()


def test_kill_9_leaves_no_bpf_program_and_the_store_intact(root_only, daemon_factory):
    tag = f"slotune-e2e-{uuid.uuid4().hex[:8]}"
    d = daemon_factory(ebpf_only_config(tag))
    server, port = serve(tag)
    try:
        ids = wait_for(lambda: prog_ids_of(d.proc.pid), 15, "the daemon's BPF programs")
        wait_for(lambda: hit(port, 20) or (d.work / "baselines.sqlite").exists() and _points(d.work), 30,
                 "a baseline point")
        before = _points(d.work)
        d.proc.kill()
        d.proc.wait()
        wait_for(lambda: not any(loaded(i) for i in ids), 10, "the kernel to drop the programs")
        db = sqlite3.connect(d.work / "baselines.sqlite")
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        db.close()
        assert _points(d.work) >= before
        again = daemon_factory(ebpf_only_config(tag), name="daemon")     # same work dir and store
        assert again.status()["services"]["plain"] is not None
        assert again.stop(signal.SIGTERM) == 0
        assert "Traceback" not in again.log()
    finally:
        server.kill()
        server.wait()


def _points(work) -> int:
    db = sqlite3.connect(work / "baselines.sqlite")
    try:
        return db.execute("SELECT count(*) FROM points").fetchone()[0]
    except sqlite3.OperationalError:
        return 0
    finally:
        db.close()


def test_sigterm_detaches_every_probe_and_exits_0(root_only, daemon_factory):
    d = daemon_factory(ebpf_only_config("slotune-e2e-nothing-matches"))
    ids = wait_for(lambda: prog_ids_of(d.proc.pid), 15, "the daemon's BPF programs")
    assert d.stop(signal.SIGTERM) == 0
    assert not any(loaded(i) for i in ids)
