"""Alerts that reach a person: a real Prometheus evaluates slotune's rules against a real
daemon (`slotune run`) watching two real tool servers of the reference stack, and a real
Alertmanager (Debian's prometheus-alertmanager, run on dashboards/alertmanager.yml) routes
them to a webhook receiver this test runs. Three faults, each with its own alert:

- drift: the search tool's latency doubles (far inside its SLO) -> SlotuneBaselineDrift;
- SLO burn: half of the weather tool's calls take longer than its SLO -> SlotuneSLOBurnFast;
- a collector going down: the daemon starts without the capabilities BPF needs (a unit
  whose CapabilityBoundingSet lost CAP_BPF), so the kernel collector cannot load ->
  SlotuneCollectorDown; the fault ends when it is restarted with them.

Each firing notification arrives with its labels and annotations (summary, a description
with the value, the runbook) within the rule's `for:` plus two evaluation intervals of the
moment Prometheus saw the condition, through the receiver its severity routes to; a
resolved notification follows once the fault ends.

Time is compressed: Prometheus loads a copy of slotune.rules.yml whose every `for:` is
divided by FOR_DIVISOR (5m -> 10s) and which differs from the shipped file in nothing else
(asserted line by line); the shipped rules keep their durations. Alertmanager runs the
shipped routes, inhibitions and grouping with 1 s waits, every receiver pointed at the test's
webhook (an email receiver cannot be delivered here).

No premise rests on the host's speed: each fault is a delay the test sets on a tool (or a
capability it takes away), and the tools' calls are paced by the test's own clock."""
from __future__ import annotations

import json
import re
import statistics
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from slotune.store.baselines import BaselineStore
from slotune.store.recorder import DRIFT_METRIC
from reference_stack import launcher
from reference_stack.client import StackClient
from tests.conftest import ROOT
from tests.test_dashboards_live import Prometheus, spawn, stop, wait_http

pytestmark = [pytest.mark.slow, pytest.mark.kernel]

RULES = ROOT / "dashboards" / "rules" / "slotune.rules.yml"
ALERTMANAGER = ROOT / "dashboards" / "alertmanager.yml"
FOR_DIVISOR = 30          # 2m -> 4s, 5m -> 10s, 15m -> 30s, 1h -> 2m
EVAL_S = 2                # Prometheus' rule evaluation interval here
ENVIRONMENT = "alerts-e2e"
NO_BPF = ["setpriv", "--bounding-set=-bpf,-perfmon,-sys_admin"]   # root without the BPF capabilities
CALLS_PER_S = 15          # per tool
DEADLINE_S = 60           # longest wait for any one notification
UNIT_S = {"s": 1, "m": 60, "h": 3600}


def seconds(duration: str) -> int:
    return int(duration[:-1]) * UNIT_S[duration[-1]]


def compressed_rules(path: Path) -> dict[str, int]:
    """Write the shipped rules with every `for:` divided by FOR_DIVISOR; alert -> its test `for:` (s)."""
    shipped = RULES.read_text().splitlines(keepends=True)

    def shorter(m: re.Match) -> str:
        return f"{m.group(1)}{seconds(m.group(2)) // FOR_DIVISOR}s"
    copy = [re.sub(r"^(\s+for: )(\d+[smh])$", shorter, line.rstrip("\n")) + "\n" for line in shipped]
    changed = [(a, b) for a, b in zip(shipped, copy) if a != b]
    assert changed and all(re.fullmatch(r"\s+for: \d+[smh]\n", a) and re.fullmatch(r"\s+for: \d+s\n", b)
                           for a, b in changed), changed
    path.write_text("".join(copy))
    return {r["alert"]: seconds(r.get("for", "0s")) for g in yaml.safe_load(path.read_text())["groups"]
            for r in g["rules"] if "alert" in r}


def alertmanager_config(path: Path, webhook: str) -> dict:
    """The shipped config with 1 s waits and every receiver a webhook to {webhook}/<receiver name>."""
    doc = yaml.safe_load(ALERTMANAGER.read_text())
    doc["global"] = {"resolve_timeout": doc["global"]["resolve_timeout"]}     # no SMTP here
    for route in [doc["route"], *doc["route"]["routes"]]:
        for key in ("group_wait", "group_interval"):
            if key in route:
                route[key] = "1s"
    for receiver in doc["receivers"]:
        name = receiver["name"]
        receiver.clear()
        receiver.update(name=name, webhook_configs=[{"url": f"{webhook}/{name}", "send_resolved": True}])
    path.write_text(yaml.safe_dump(doc))
    return doc


def prometheus_config(path: Path, rules: Path, daemon_port: int, am_port: int) -> None:
    path.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": f"{EVAL_S}s"},
        "rule_files": [str(rules)],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]},
        "scrape_configs": [{"job_name": "slotune", "static_configs": [{"targets": [f"127.0.0.1:{daemon_port}"]}]}],
    }))


def daemon_config(work: Path, port: int, tools: dict[str, int]) -> str:
    """search: a drift tuner deciding every 2 s against the local store; weather: a 100 ms SLO."""
    def service(name: str, slo_ms: float) -> str:
        return (f'[services.{name}]\nport = {tools[name]}\nmetrics_url = "http://127.0.0.1:{tools[name]}/metrics"\n'
                f'latency_metric = "tool_request_duration_seconds"\nslo_p99_ms = {slo_ms}\n')
    return (f'[daemon]\nexporter_address = "127.0.0.1:{port}"\nbaseline_store = "{work}/baselines.sqlite"\n'
            f'audit_log = "{work}/audit.jsonl"\nenvironment = "{ENVIRONMENT}"\nprobes = ["runqueue"]\n\n'
            + service("search", 500) + '[services.search.tuners.drift]\npolicy = "whitepaper"\ninterval_s = 2.0\n'
            'baseline_days = 1.0\n\n' + service("weather", 100))


class Receiver:
    """The webhook Alertmanager notifies: every POST kept with its arrival time and path."""

    def __init__(self):
        self.got: list[tuple[float, str, dict]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                receiver.got.append((time.time(), self.path, body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def first(self, alertname: str, status: str, after: float = 0.0):
        """(arrival, receiver path, alert) of the first notification of that alert in that status."""
        for t, path, body in list(self.got):
            for alert in body["alerts"]:
                if alert["labels"]["alertname"] == alertname and alert["status"] == status and t >= after:
                    return t, path, alert
        return None

    def wait(self, alertname: str, status: str, after: float = 0.0):
        deadline = time.monotonic() + DEADLINE_S
        while (found := self.first(alertname, status, after)) is None:
            assert time.monotonic() < deadline, (f"no {status} {alertname} reached the receiver in {DEADLINE_S} s; "
                                                 f"got {[(p, [a['labels']['alertname'] for a in b['alerts']]) for _, p, b in self.got]}")
            time.sleep(0.2)
        return found

    def close(self):
        self.httpd.shutdown()


class ActiveSince:
    """When Prometheus first saw each alert's condition (its activeAt), polled from /api/v1/alerts:
    an alert leaves that list once resolved, so it is watched throughout."""

    def __init__(self, prom: Prometheus):
        self.prom, self.seen, self.stopped = prom, {}, threading.Event()
        threading.Thread(target=self.run, daemon=True).start()

    def run(self):
        while not self.stopped.wait(0.5):
            try:
                alerts = self.prom.get("/api/v1/alerts")["data"]["alerts"]
            except OSError:
                continue
            for a in alerts:
                self.seen.setdefault(a["labels"]["alertname"], parse_time(a["activeAt"]))


def parse_time(text: str) -> float:
    """Prometheus' and Alertmanager's RFC 3339 times (nanoseconds, Z or an offset) -> epoch seconds."""
    from datetime import datetime
    text = re.sub(r"(\.\d{6})\d+", r"\1", text).replace("Z", "+00:00")
    return datetime.fromisoformat(text).timestamp()


def calls(url: str, stopped: threading.Event) -> None:
    """CALLS_PER_S tool calls a second, one at a time, until stopped."""
    body = json.dumps({"args": {"q": "gpu"}}).encode()
    while not stopped.is_set():
        began = time.monotonic()
        req = urllib.request.Request(url + "/call", data=body, headers={"Content-Type": "application/json"})
        try:
            urllib.request.urlopen(req, timeout=5).read()
        except OSError:
            pass
        stopped.wait(max(0.0, 1 / CALLS_PER_S - (time.monotonic() - began)))


def seed_baseline(store: str, p99: float) -> None:
    """A day of search at its calm P99, as a daemon that ran before would have left."""
    now = time.time()
    with BaselineStore(store) as s:
        s.record_many([("search", DRIFT_METRIC, p99, now - 86400 + i * 600, ENVIRONMENT, "earlier")
                       for i in range(144)])


def held_at(prom: Prometheus, selector: str, alert: dict) -> float:
    """The series' value at the evaluation that fired the alert (its startsAt)."""
    found = prom.get("/api/v1/query", query=selector, time=parse_time(alert["startsAt"]))["data"]["result"]
    assert len(found) == 1, (selector, found)
    return float(found[0]["value"][1])


def check_alert(alert: dict, alertname: str, severity: str, service: str | None, instance: str) -> None:
    labels, notes = alert["labels"], alert["annotations"]
    assert labels["severity"] == severity and labels["instance"] == instance and labels["job"] == "slotune"
    if service:
        assert labels["service"] == service
    assert notes["runbook"] == f"docs/dashboards.md, runbook: {alertname}"
    assert instance in notes["summary"] + notes["description"] and "{{" not in notes["description"]


@pytest.fixture
def world(tmp_path):
    procs, stops = {}, []
    receiver = Receiver()
    stops.append(receiver.close)
    try:
        yield tmp_path, procs, receiver, stops
    finally:
        for stop_it in reversed(stops):
            stop_it()
        for proc in reversed(list(procs.values())):
            stop(proc)


def test_drift_slo_burn_and_a_collector_down_reach_the_receiver_and_resolve(world):
    tmp, procs, receiver, stops = world
    daemon_port, prom_port, am_port, search_port, weather_port = launcher.free_ports(5)
    tools = {"search": search_port, "weather": weather_port}
    instance = f"127.0.0.1:{daemon_port}"

    # The reference stack's tool servers: flat latency, so the calm P99 is one number.
    files = launcher.init_run_dir(tmp / "stack")
    for name, port in tools.items():
        procs[name] = spawn([sys.executable, "-m", "reference_stack", "tool", "--name", name, "--port", str(port),
                             "--run-dir", str(tmp / "stack"), "--set", "latency_sigma=0",
                             "--set", f"latency_ms={30 if name == 'search' else 20}"], tmp / f"{name}.log")
    stack = StackClient({"urls": {n: f"http://127.0.0.1:{p}" for n, p in tools.items()},
                         "run_dir": str(tmp / "stack"), "token_file": str(files["token_file"])})

    test_for = compressed_rules(tmp / "slotune.rules.yml")
    am = alertmanager_config(tmp / "alertmanager.yml", receiver.url)
    procs["alertmanager"] = spawn(["prometheus-alertmanager", f"--config.file={tmp / 'alertmanager.yml'}",
                                   f"--storage.path={tmp / 'am'}", f"--web.listen-address=127.0.0.1:{am_port}",
                                   "--cluster.listen-address="], tmp / "alertmanager.log")
    prometheus_config(tmp / "prometheus.yml", tmp / "slotune.rules.yml", daemon_port, am_port)
    procs["prometheus"] = spawn(["prometheus", f"--config.file={tmp / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={tmp / 'tsdb'}", f"--web.listen-address=127.0.0.1:{prom_port}"],
                                tmp / "prometheus.log")
    (tmp / "slotune.toml").write_text(daemon_config(tmp, daemon_port, tools))
    run_daemon = [sys.executable, "-m", "slotune.cli", "run", "--config", str(tmp / "slotune.toml")]
    procs["daemon"] = spawn(NO_BPF + run_daemon, tmp / "daemon-no-bpf.log")        # fault 3 starts here

    for name, port in tools.items():
        wait_http(f"http://127.0.0.1:{port}/healthz", name, procs[name], tmp / f"{name}.log")
    wait_http(f"http://127.0.0.1:{am_port}/-/ready", "alertmanager", procs["alertmanager"], tmp / "alertmanager.log")
    wait_http(f"http://127.0.0.1:{prom_port}/-/ready", "prometheus", procs["prometheus"], tmp / "prometheus.log")
    wait_http(f"http://{instance}/status", "slotune run (no BPF)", procs["daemon"], tmp / "daemon-no-bpf.log")
    prom = Prometheus(f"http://127.0.0.1:{prom_port}")
    loaded = [r for g in prom.get("/api/v1/rules")["data"]["groups"] for r in g["rules"] if r["type"] == "alerting"]
    assert {r["name"]: r["duration"] for r in loaded} == test_for
    active = ActiveSince(prom)
    stops.append(active.stopped.set)
    load_stopped = threading.Event()
    stops.append(load_stopped.set)
    for port in tools.values():
        threading.Thread(target=calls, args=(f"http://127.0.0.1:{port}", load_stopped), daemon=True).start()

    # Calm: the daemon's P99 of search becomes the stored baseline.
    calm = []
    deadline = time.monotonic() + DEADLINE_S
    while len(calm) < 5:
        assert time.monotonic() < deadline, "the daemon never showed search's P99"
        p99 = json.loads(urllib.request.urlopen(f"http://{instance}/status", timeout=3).read())[
            "services"]["search"]["p99_s"]
        if p99:
            calm.append(p99)
        time.sleep(0.5)
    seed_baseline(str(tmp / "baselines.sqlite"), statistics.median(calm))
    time.sleep(3)     # a few calm windows for the burn-rate windows to start from

    faults_began = time.time()
    stack.patch("search", latency_ms=60)                      # fault 1: drift, 50 ms -> 75 ms P99
    stack.patch("weather", tail_prob=0.5, tail_ms=300)        # fault 2: half the calls 300 ms over
    fired = {name: receiver.wait(name, "firing")
             for name in ("SlotuneBaselineDrift", "SlotuneSLOBurnFast", "SlotuneCollectorDown")}
    stack.patch("search", latency_ms=30)
    stack.patch("weather", tail_prob=0.0)
    faults_ended = time.time()
    resolved = {name: receiver.wait(name, "resolved", after=faults_ended)
                for name in ("SlotuneBaselineDrift", "SlotuneSLOBurnFast")}

    stop(procs.pop("daemon"))                                 # fault 3 ends: the daemon as its unit should run it
    collector_fixed = time.time()
    procs["daemon"] = spawn(run_daemon, tmp / "daemon.log")
    wait_http(f"http://{instance}/status", "slotune run", procs["daemon"], tmp / "daemon.log")
    resolved["SlotuneCollectorDown"] = receiver.wait("SlotuneCollectorDown", "resolved", after=collector_fixed)
    up = prom.query(f'slotune_collector_up{{collector="kernel",instance="{instance}"}}')
    deadline = time.monotonic() + 10
    while [s["value"][1] for s in up] != ["1"]:
        assert time.monotonic() < deadline, f"the restarted daemon's kernel collector is not up: {up}"
        time.sleep(1)
        up = prom.query(f'slotune_collector_up{{collector="kernel",instance="{instance}"}}')

    routes = {"SlotuneBaselineDrift": ("ticket", "search"), "SlotuneSLOBurnFast": ("page", "weather"),
              "SlotuneCollectorDown": ("ticket", None)}
    receivers = {r["matchers"][0]: r["receiver"] for r in am["route"]["routes"]}
    for name, (severity, service) in routes.items():
        arrived, path, alert = fired[name]
        check_alert(alert, name, severity, service, instance)
        assert path == "/" + receivers[f'severity="{severity}"'], (name, path)
        began = active.seen[name]
        assert began >= faults_began - 1 or name == "SlotuneCollectorDown"
        delay = arrived - began
        print(f"{name}: condition at {began - faults_began:+.1f} s of the faults, notified {delay:.1f} s later "
              f"(for: {test_for[name]} s), resolved {resolved[name][0] - max(faults_ended, collector_fixed if name == 'SlotuneCollectorDown' else 0):.1f} s after the fault ended")
        assert test_for[name] <= delay <= test_for[name] + 2 * EVAL_S, (name, delay)
        _, path, gone = resolved[name]
        assert path == "/" + receivers[f'severity="{severity}"'] and gone["labels"] == alert["labels"]
        assert parse_time(gone["endsAt"]) >= (collector_fixed if name == "SlotuneCollectorDown" else faults_ended) - 1

    cleared = [e["t"] for e in map(json.loads, (tmp / "audit.jsonl").read_text().splitlines())
               if e["tuner"] == "drift" and e["outcome"] == "alert cleared" and e["t"] >= faults_ended]
    print(f"the daemon cleared its drift alert {cleared[0] - faults_ended:.1f} s after the fault ended")
    drift = fired["SlotuneBaselineDrift"][2]
    assert drift["labels"]["metric"] == DRIFT_METRIC
    # The values in the descriptions are those Prometheus held when the alert fired.
    shift = float(re.search(r"is at ([0-9.]+)% against", drift["annotations"]["description"]).group(1))
    assert shift > 8 and shift == pytest.approx(100 * held_at(
        prom, f'slotune_drift_deviation_ratio{{service="search",instance="{instance}"}}', drift), abs=0.1)
    burn = fired["SlotuneSLOBurnFast"][2]
    rate = float(re.search(r"at ([0-9.]+)x over the last hour", burn["annotations"]["description"]).group(1))
    assert rate > 14.4 and rate == pytest.approx(held_at(
        prom, f'service:slotune_slo_burn_rate:ratio_rate1h{{service="weather",instance="{instance}"}}', burn), abs=0.06)
    down = fired["SlotuneCollectorDown"][2]
    assert down["labels"]["collector"] == "kernel" and "slotune_collector_up = 0" in down["annotations"]["description"]
