"""Live: a real Prometheus (started here, 1 s scrapes, slotune's rules loaded) scrapes the
real daemon (`slotune run`, real BPF) and the real reference stack under load from its
load generator; every query of every dashboard panel and variable, and every recording
rule, must return data, and every rule must evaluate without error."""
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from slotune.collectors.kernel import program_cost
from slotune.export import dashboards
from reference_stack import launcher
from reference_stack.client import StackClient
from reference_stack.ports import DEFAULTS
from tests.conftest import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.kernel]

RULES = ROOT / "dashboards" / "rules" / "slotune.rules.yml"
# Without a GPU the GPU dashboard has nothing to draw (NVML is absent, so no slotune_gpu_* series
# exist): it is left out of the non-empty check, and the nvml collector must report itself down.
NEEDS_A_GPU = {"slotune-gpu"}
# Panels of events a healthy loopback stack never produces: TCP retransmits need a lossy link
# (tests/probes/test_tcp.py makes one and checks the counter). Their queries must still be valid.
ONLY_ON_FAULTS = {"slotune-kernel / Retransmits"}
# The host-against-its-fleet rules and their panel need three hosts or more: one daemon here
# has no fleet (tests/e2e/test_fleet.py runs them on a fleet of three).
NEEDS_A_FLEET = ("fleet:", "service:slotune_host_outlier", "slotune-fleet / Hosts slower than their fleet")
# Template variables as "All" selects them; $__rate_interval as Grafana sets it for 1 s scrapes.
SUBSTITUTE = {"$__rate_interval": "10s", "$instance": ".+", "$service": ".+", "$setting": ".+", "$peer": ".+",
              "$gpu": ".+"}
WAIT_S = 90          # longest wait for every query to have data, once the load runs
CALM_S = 15          # load without a fault first: the attribution's baseline windows


def gpu_present() -> bool:
    try:
        import pynvml
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return True
    except Exception:
        return False


def daemon_config(path: Path, cfg: launcher.StackConfig, metrics_port: int) -> None:
    """slotune.example.toml (the documented config for the reference stack) with this run's ports
    and files, and every tuner deciding every 2 s so decisions come within the test."""
    now = {"gateway": cfg.gateway_port, "inference": cfg.inference_port, "sidecar": cfg.sidecar_port,
           "sidecar_admin": cfg.sidecar_admin_port, **cfg.tool_ports}
    ports = {DEFAULTS[name]: port for name, port in now.items()} | {9477: metrics_port}
    text = (ROOT / "slotune.example.toml").read_text()
    text = re.sub(r"\b(%s)\b" % "|".join(map(str, ports)), lambda m: str(ports[int(m.group())]), text)
    text = text.replace("/var/lib/slotune-stack/", f"{cfg.run_dir}/").replace("/var/lib/slotune/", f"{path.parent}/")
    text = re.sub(r"^(tune_)?interval_s = [0-9.]+", r"\1interval_s = 2.0", text, flags=re.M)
    # Token objectives on the gateway, timed by the kernel (its first response byte, the gaps
    # between its writes), so the TTFT/TPOT burn-rate rules have series.
    text = text.replace("slo_p99_ms = 800.0 ", "slo_ttft_p99_ms = 800.0\nslo_tpot_p99_ms = 50.0\nslo_p99_ms = 800.0 ", 1)
    path.write_text(text)


def seed_baselines(config: Path, days: float = 1.0) -> None:
    """A day of stored P99 history for every service, as a daemon that ran before would have left:
    the drift tuner compares against it (without one it has nothing to say)."""
    from slotune import config as config_mod
    from slotune.store.baselines import BaselineStore
    from slotune.store.recorder import DRIFT_METRIC
    cfg = config_mod.load(config)
    now = time.time()
    store = BaselineStore(cfg.baseline_store)
    try:
        store.record_many([(svc.name, DRIFT_METRIC, 0.05 * (1 + 0.01 * (i % 7)), now - days * 86400 + i * 600,
                            cfg.environment, "earlier") for svc in cfg.services for i in range(int(days * 144))])
    finally:
        store.close()


def prometheus_config(path: Path, cfg: launcher.StackConfig, metrics_port: int) -> None:
    """dashboards/prometheus.yml with this run's ports, 1 s scrapes and the rules by absolute path."""
    doc = yaml.safe_load((ROOT / "dashboards" / "prometheus.yml").read_text())
    doc["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    doc["rule_files"] = [str(RULES)]
    ports = {"slotune": [metrics_port], "gateway": [cfg.gateway_port], "inference": [cfg.inference_port],
             "tools": [cfg.tool_ports[n] for n in ("search", "calculator", "weather")],
             "sidecar": [cfg.sidecar_admin_port]}
    for job in doc["scrape_configs"]:
        for group, port in zip(job["static_configs"], ports.pop(job["job_name"]), strict=True):
            group["targets"] = [f"127.0.0.1:{port}"]
    assert not ports, f"dashboards/prometheus.yml has no job for {sorted(ports)}"
    path.write_text(yaml.safe_dump(doc))


def wait_http(url: str, what: str, proc: subprocess.Popen, log: Path, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"{what} exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.3)
    pytest.fail(f"{what} did not answer {url} in {timeout_s:.0f} s:\n{log.read_text()[-3000:]}")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def spawn(argv: list[str], log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=ROOT)


class Prometheus:
    def __init__(self, url: str):
        self.url = url

    def get(self, path: str, **params) -> dict:
        with urllib.request.urlopen(f"{self.url}{path}?{urllib.parse.urlencode(params)}", timeout=10) as r:
            return json.loads(r.read())

    def query(self, expr: str) -> list:
        answer = self.get("/api/v1/query", query=expr)
        assert answer["status"] == "success", f"{expr!r}: {answer}"
        return answer["data"]["result"]


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.fail("this test needs root for the daemon's BPF probes (make test runs as root)")
    tmp = tmp_path_factory.mktemp("live")
    cfg = launcher.StackConfig.on_free_ports(
        tmp / "stack",
        inference_args=["--device", "cpu", "--d-model", "64", "--layers", "2", "--heads", "4",
                        "--max-new-tokens", "4"],
        # TLS on the LLM path with a handshake per request, and a tool that sometimes fails,
        # so the TLS, connection and tool-failure panels have something to show.
        settings={"gateway": {"llm_via_sidecar": True}, "sidecar": {"reuse_connections": False},
                  "search": {"failure_rate": 0.05}})
    metrics_port, prom_port = launcher.free_ports(2)
    procs = []
    # The kernel times BPF programs only while this sysctl is 1 (an operator's choice: the
    # probe-cost panels are empty without it); put back as it was at the end.
    stats_were = program_cost.STATS_SYSCTL.read_text()
    stack = StackClient(launcher.start(cfg))
    try:
        program_cost.STATS_SYSCTL.write_text("1")
        daemon_config(tmp / "slotune.toml", cfg, metrics_port)
        seed_baselines(tmp / "slotune.toml")
        daemon = spawn([sys.executable, "-m", "slotune.cli", "run", "--dry-run", "--config", str(tmp / "slotune.toml")],
                       tmp / "daemon.log")
        procs.append(daemon)
        prometheus_config(tmp / "prometheus.yml", cfg, metrics_port)
        prom = spawn(["/usr/bin/prometheus", f"--config.file={tmp / 'prometheus.yml'}",
                      f"--storage.tsdb.path={tmp / 'tsdb'}", f"--web.listen-address=127.0.0.1:{prom_port}"],
                     tmp / "prometheus.log")
        procs.append(prom)
        wait_http(f"http://127.0.0.1:{metrics_port}/metrics", "slotune run", daemon, tmp / "daemon.log")
        wait_http(f"http://127.0.0.1:{prom_port}/-/ready", "prometheus", prom, tmp / "prometheus.log")
        load = spawn([sys.executable, "-m", "reference_stack", "load", "--url",
                      f"http://127.0.0.1:{cfg.gateway_port}/query", "--rate", "8", "--duration", str(CALM_S + WAIT_S + 30)],
                     tmp / "load.log")
        procs.append(load)
        # A clean service has no dominant cause: after a calm baseline, stall the gateway's event
        # loop so the attribution has a tail to explain (its panels stay empty otherwise).
        time.sleep(CALM_S)
        stack.patch("gateway", blocking_io_ms=20.0)
        yield Prometheus(f"http://127.0.0.1:{prom_port}"), tmp
    finally:
        for proc in reversed(procs):
            stop(proc)
        launcher.stop(cfg.run_dir)
        program_cost.STATS_SYSCTL.write_text(stats_were)


def substitute(expr: str) -> str:
    for var, value in SUBSTITUTE.items():
        expr = expr.replace(var, value)
    assert "$" not in expr, f"a template variable is left in {expr!r}"
    return expr


def dashboard_queries(model: dict) -> list[tuple[str, str]]:
    """(where, expr) of every panel target and every query variable (label_values(sel, l) -> sel)."""
    out = []
    for panel in model["panels"]:
        if f"{model['uid']} / {panel['title']}" in ONLY_ON_FAULTS:
            continue
        for t in panel.get("targets", []):
            out.append((f"{model['uid']} / {panel['title']} / {t['refId']}", substitute(t["expr"])))
    for v in model["templating"]["list"]:
        if v["type"] == "query":
            selector = re.fullmatch(r"label_values\((.+), *\w+\)", v["definition"]).group(1)
            out.append((f"{model['uid']} / variable {v['name']}", substitute(selector)))
    return out


def wait_until_all_have_data(prom: Prometheus, queries: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Re-run the queries still empty until none is or WAIT_S passes; returns those still empty."""
    empty = list(queries)
    deadline = time.monotonic() + WAIT_S
    while empty and time.monotonic() < deadline:
        empty = [(where, expr) for where, expr in empty if not prom.query(expr)]
        if empty:
            time.sleep(3)
    return empty


def test_every_panel_and_recording_rule_has_data(live):
    prom, tmp = live
    models = dashboards.all_dashboards()
    with_gpu = gpu_present()
    queries = [q for uid, model in models.items() if with_gpu or uid not in NEEDS_A_GPU
               for q in dashboard_queries(model)]
    rules = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    queries += [(f"recording rule {r['record']} {r.get('labels', {})}",
                 r["record"] + "{" + ",".join(f'{k}="{v}"' for k, v in r.get("labels", {}).items()) + "}")
                for r in rules if "record" in r]
    queries = [(where, expr) for where, expr in queries
               if not any(where.startswith(f) or f in expr for f in NEEDS_A_FLEET)]
    empty = wait_until_all_have_data(prom, queries)
    assert not empty, "no data for:\n" + "\n".join(f"  {w}: {e}" for w, e in empty) + \
        f"\n(daemon log: {tmp / 'daemon.log'})"
    if not with_gpu:
        nvml = prom.query('slotune_collector_up{collector="nvml"}')
        assert [s["value"][1] for s in nvml] == ["0"], nvml


def test_every_rule_evaluates_and_annotations_are_valid_promql(live):
    prom, _ = live
    deadline = time.monotonic() + 15
    while True:                      # every rule evaluated at least once (1 s interval)
        loaded = [r for g in prom.get("/api/v1/rules")["data"]["groups"] for r in g["rules"]]
        if all(r["health"] != "unknown" for r in loaded) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert len(loaded) == sum(len(g["rules"]) for g in yaml.safe_load(RULES.read_text())["groups"])
    bad = [(r["name"], r.get("lastError")) for r in loaded if r["health"] != "ok"]
    assert not bad, bad
    # Decisions marked as annotations happen when they happen (a rollback may never come in a
    # short run), and fault-only panels stay empty: each query must be accepted, data or not.
    for model in dashboards.all_dashboards().values():
        for note in model["annotations"]["list"]:
            prom.query(substitute(note["expr"]))
        for panel in model["panels"]:
            if f"{model['uid']} / {panel['title']}" in ONLY_ON_FAULTS:
                for t in panel["targets"]:
                    prom.query(substitute(t["expr"]))
    targets = prom.get("/api/v1/targets")["data"]["activeTargets"]
    assert {t["labels"]["job"] for t in targets if t["health"] == "up"} == \
        {"slotune", "gateway", "inference", "tools", "sidecar"}, [(t["scrapeUrl"], t["lastError"]) for t in targets]
