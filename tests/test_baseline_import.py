"""Prometheus as the store of record, against a real Prometheus 2.42: a week of a
fleet's history backfilled with `promtool tsdb create-blocks-from openmetrics`
(this host in production through deploys v41 and v42, another host in staging),
and a live daemon scraped every second. `slotune baseline import` copies one
service, or every configured one, into the local store under each point's
deploy id; a daemon with baseline_source = "prometheus" raises its drift alert
from that history, falls back to its local store when Prometheus stops (said
once) and goes back to Prometheus when it answers again."""
import logging
import re
import socket
import subprocess
import textwrap
import time
from urllib.request import urlopen

import pytest

from slotune import config
from slotune.store.audit import Outcome
from slotune.model.histogram import Histogram
from slotune.model.sample import Sample
from slotune.model.window import EBPF_LATENCY
from slotune.process import Daemon
from slotune.store.baselines import BaselineStore
from slotune.store.prometheus_history import DEPLOY_INFO, PrometheusHistory
from slotune.store.recorder import DRIFT_METRIC, PROMETHEUS_REFRESH_S
from reference_stack.launcher import free_ports
from tests.conftest import StandInCollector, run_slotune

HOST = socket.gethostname()
DAY, SCRAPE_S = 86400, 60          # the backfilled week has one sample a minute per series
P99 = {"gw": 0.200, "inf": 0.050, "agent": 0.200}   # this host's services, deploy v41 (v42: +5 %)
OTHER = ("gpu-other", "staging", "s7", 0.900)        # another host's gw: host, environment, deploy, P99
LIVE_P99 = Histogram.from_values([300_000_000] * 50).quantile(0.99)   # what the live daemon's agent shows
DEADLINE_S = 60


def wobble(i: int) -> float:
    return 1 + 0.01 * (i % 7 - 3)


def openmetrics(now: int, instance: str) -> str:
    """A week up to 10 minutes ago: this host switched from v41 to v42 three days ago."""
    times = range(now - 7 * DAY, now - 600, SCRAPE_S)
    switch = now - 3 * DAY
    here = f'instance="{instance}",job="slotune"'
    other_host, other_env, other_deploy, other_p99 = OTHER
    there = 'instance="10.0.0.2:9477",job="slotune"'
    lines = [f"# TYPE {DEPLOY_INFO} gauge"]
    for deploy, keep in (("v41", lambda t: t < switch), ("v42", lambda t: t >= switch)):
        lines += [f'{DEPLOY_INFO}{{{here},host="{HOST}",environment="production",deploy_id="{deploy}"}} 1 {t}'
                  for t in times if keep(t)]
    lines += [f'{DEPLOY_INFO}{{{there},host="{other_host}",environment="{other_env}",deploy_id="{other_deploy}"}} '
              f'1 {t}' for t in times]
    lines.append("# TYPE slotune_service_latency_seconds gauge")
    for service, p99 in P99.items():
        lines += [f'slotune_service_latency_seconds{{{here},service="{service}",quantile="0.99"}} '
                  f'{p99 * wobble(i) * (1.05 if t >= switch else 1):.6f} {t}' for i, t in enumerate(times)]
    lines += [f'slotune_service_latency_seconds{{{there},service="gw",quantile="0.99"}} {other_p99} {t}'
              for t in times]
    lines.append("# TYPE slotune_service_requests counter")
    lines += [f'slotune_service_requests_total{{{here},service="gw"}} {10 * (t - times[0])} {t}' for t in times]
    return "\n".join(lines + ["# EOF", ""])


class Prometheus:
    """prometheus on a loopback port over a storage folder; stop() and start() keep both."""

    def __init__(self, folder, port: int):
        self.folder, self.url, self.proc = folder, f"http://127.0.0.1:{port}", None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["prometheus", f"--config.file={self.folder / 'prometheus.yml'}", f"--storage.tsdb.path={self.folder / 'data'}",
             f"--web.listen-address={self.url[7:]}", "--log.level=warn"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + DEADLINE_S
        while True:
            try:
                with urlopen(self.url + "/-/ready", timeout=1):
                    return
            except OSError:
                assert self.proc.poll() is None, f"prometheus exited: {self.proc.stderr.read().decode()}"
                assert time.monotonic() < deadline, "prometheus not ready"
                time.sleep(0.2)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    """The backfilled week, and a scrape every second of the (test's) daemon on daemon_port."""
    folder = tmp_path_factory.mktemp("prometheus")
    prom_port, daemon_port = free_ports(2)
    now = int(time.time()) // SCRAPE_S * SCRAPE_S
    (folder / "week.om").write_text(openmetrics(now, f"127.0.0.1:{daemon_port}"))
    subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", "-q", str(folder / "week.om"),
                    str(folder / "data")], check=True, capture_output=True, timeout=300)
    (folder / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s}\n"
        f"scrape_configs: [{{job_name: slotune, static_configs: [{{targets: ['127.0.0.1:{daemon_port}']}}]}}]\n")
    prom = Prometheus(folder, prom_port)
    prom.daemon_port = daemon_port
    prom.start()
    try:
        yield prom
    finally:
        prom.stop()


def slotune_import(*args):
    return run_slotune("baseline", "import", "--since", "7d", *args)


def test_import_of_one_service_keeps_each_deploy_and_leaves_other_hosts_out(prometheus, tmp_path):
    store = tmp_path / "baselines.sqlite"
    out = slotune_import("--from-prometheus", prometheus.url, "--service", "gw", "--metric", DRIFT_METRIC,
                         "--store", str(store))
    assert out.returncode == 0, out.stderr
    head, where, row, total = out.stdout.splitlines()
    assert re.fullmatch(rf"importing the last 7d \(\d{{4}}-\d\d-\d\d \d\d:\d\d \.\. .* UTC, one point per 60 s\) "
                        rf"of host {re.escape(HOST)}, environment production", head), head
    assert where == f"  from Prometheus at {prometheus.url} into {store}"
    assert re.fullmatch(r"gw  latency_p99_seconds +1\d,\d{3} points  mean 0\.20\d  deploys v41 \(5,7\d\d\), "
                        r"v42 \(4,3\d\d\)", row), row
    assert re.fullmatch(r"imported 1\d,\d{3} points \(1 service\(s\) x 1 metric\(s\)\) in \d+\.\d s", total), total
    with BaselineStore(store) as s:
        v41 = s.summary("gw", DRIFT_METRIC, "production", "v41")
        v42 = s.summary("gw", DRIFT_METRIC, "production", "v42")
        kept = {(i.service, i.environment) for i in s.list()}
    assert abs(v41.count - 4 * 1440) <= 2 and abs(v42.count - (3 * 1440 - 10)) <= 2
    assert v41.mean == pytest.approx(P99["gw"], rel=0.005) and v42.mean == pytest.approx(1.05 * P99["gw"], rel=0.005)
    assert kept == {("gw", "production")}        # the staging host's 0.9 s stayed out

    again = slotune_import("--from-prometheus", prometheus.url, "--service", "gw", "--metric", DRIFT_METRIC,
                           "--store", str(store))
    assert again.returncode == 0, again.stderr
    with BaselineStore(store) as s:                # a second import replaces, it does not double
        assert s.summary("gw", DRIFT_METRIC, "production", "v41").count == v41.count
    diffed = run_slotune("baseline", "diff", "gw", "--from", "v41", "--to", "v42", "--store", str(store))
    assert diffed.returncode == 0, diffed.stderr
    assert float(diffed.stdout.splitlines()[2].split()[3].rstrip("%")) == pytest.approx(5.0, abs=0.3)


def test_import_of_every_configured_service_and_metric(prometheus, tmp_path):
    (tmp_path / "slotune.toml").write_text(textwrap.dedent(f"""
        [daemon]
        baseline_store = "{tmp_path}/baselines.sqlite"
        prometheus_url = "{prometheus.url}"
        [services.gw]
        port = 8080
        [services.inf]
        port = 8100
        """))
    out = slotune_import("--config", str(tmp_path / "slotune.toml"))
    assert out.returncode == 0, out.stderr
    rows = {tuple(line.split()[:2]): line for line in out.stdout.splitlines()[2:-1]}
    assert list(rows) == [(s, m) for s in ("gw", "inf") for m in
                          ("latency_p50_seconds", "latency_p99_seconds", "throughput_rps", "error_ratio")]
    assert "mean 0.0511 " in rows[("inf", DRIFT_METRIC)] and "mean 10 " in rows[("gw", "throughput_rps")]
    assert rows[("gw", "error_ratio")].split()[2:] == ["none"]
    assert out.stdout.splitlines()[-1].startswith("imported ") and "(2 service(s) x 4 metric(s))" in out.stdout
    assert f"no points for 5 of 8, e.g. gw latency_p50_seconds: Prometheus at {prometheus.url} answered none" \
           in out.stderr
    assert 'quantile="0.5"' in out.stderr and f'{DEPLOY_INFO}{{host="{HOST}", environment="production"}}' in out.stderr
    with BaselineStore(tmp_path / "baselines.sqlite") as s:
        assert {(i.service, i.metric, i.deploy_id) for i in s.list()} == {
            (svc, m, d) for svc in ("gw", "inf") for m in (DRIFT_METRIC,) for d in ("v41", "v42")} | {
            ("gw", "throughput_rps", d) for d in ("v41", "v42")}


def test_import_of_another_host_in_another_environment(prometheus, tmp_path):
    host, environment, deploy, p99 = OTHER
    out = slotune_import("--from-prometheus", prometheus.url, "--service", "gw", "--metric", DRIFT_METRIC,
                         "--host", host, "--environment", environment, "--store", str(tmp_path / "b.sqlite"))
    assert out.returncode == 0, out.stderr
    with BaselineStore(tmp_path / "b.sqlite") as s:
        assert s.summary("gw", DRIFT_METRIC, environment, deploy).mean == pytest.approx(p99)


def test_import_errors_name_the_url_the_query_and_the_fix(prometheus, tmp_path):
    store = ["--store", str(tmp_path / "b.sqlite")]
    down = f"http://127.0.0.1:{free_ports(1)[0]}"
    out = slotune_import("--from-prometheus", down, "--service", "gw", *store)
    assert out.returncode == 2
    assert re.search(rf"Prometheus at {down}, query \(avg_over_time\(slotune_service_latency_seconds"
                     r'\{service="gw",quantile="0.5"\}\[60s\]\)\) \* on \(instance\) .*: not reachable: .*'
                     r"\(check the URL and that Prometheus runs\)", out.stderr), out.stderr
    out = slotune_import("--from-prometheus", prometheus.url, "--service", "gw", "--metric", DRIFT_METRIC,
                         "--host", "nobody", *store)
    assert out.returncode == 1 and "imported 0 points" in out.stdout
    assert 'host="nobody"' in out.stderr and "else pass --host or --environment" in out.stderr
    for args, says in ((["--from-prometheus", prometheus.url, "--service", "gw", "--since", "7x"],
                        "--since '7x' is not a duration; use e.g. 90s, 30m, 12h, 7d or 2w"),
                       (["--service", "gw"], "which Prometheus? pass --from-prometheus URL"),
                       (["--from-prometheus", "prom:9090", "--service", "gw"], "'prom:9090' is not an http(s) URL"),
                       (["--from-prometheus", prometheus.url], "which services? pass --service NAME"),
                       (["--from-prometheus", prometheus.url, "--service", "gw", "--metric", "p98"],
                        "no PromQL for metric 'p98'; known: latency_p50_seconds")):
        out = run_slotune("baseline", "import", *args, *store)
        assert out.returncode == 2 and says in out.stderr, (args, out.stderr)


class SteadyAgent(StandInCollector):
    """A stand-in collector: every request of the agent takes 300 ms."""
    name = "steady"

    def collect(self, start, end):
        latency = Histogram.from_values([300_000_000] * 50)
        return [Sample("agent", self.name, start, end, histograms={EBPF_LATENCY: latency})]


def drift_entries(daemon, outcome):
    return [e for e in daemon.audit.recent if e.tuner == "drift" and e.outcome == outcome]


def step_until(daemon, clock, predicate, most_s):
    """10 s windows of fast time from clock[0] until predicate() holds; fails after most_s."""
    start = clock[0]
    while not predicate():
        assert clock[0] - start < most_s, f"not within {most_s} s of windows"
        daemon.step(clock[0], clock[0] + 10.0)
        clock[0] += 10.0


def test_the_daemon_reads_its_drift_baseline_from_prometheus_and_falls_back_once(prometheus, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="slotune.store.recorder")
    (tmp_path / "slotune.toml").write_text(textwrap.dedent(f"""
        [daemon]
        exporter_address = "127.0.0.1:{prometheus.daemon_port}"
        baseline_store = "{tmp_path}/baselines.sqlite"
        audit_log = "{tmp_path}/audit.jsonl"
        state_file = "{tmp_path}/state.json"
        deploy_id = "v43"
        prometheus_url = "{prometheus.url}"
        baseline_source = "prometheus"
        [services.agent]
        port = 8300
        slo_p99_ms = 5000
        [services.agent.tuners.drift]
        policy = "whitepaper"
        interval_s = 10.0
        """))
    daemon = Daemon(config.load(tmp_path / "slotune.toml"), collectors=[SteadyAgent()])
    clock = [time.time()]
    # The local store says the agent always took what it takes now: from it, there is no drift.
    daemon.store.record_many(("agent", DRIFT_METRIC, LIVE_P99, clock[0] - DAY + i * 60, "production", "v40")
                             for i in range(1440))
    daemon.start()
    try:
        # Prometheus' week (0.2 s) against today's 0.3 s: the alert is raised from Prometheus' history.
        step_until(daemon, clock, lambda: drift_entries(daemon, Outcome.ALERT_RAISED), 60)
        raised = drift_entries(daemon, Outcome.ALERT_RAISED)[0]
        assert raised.old == pytest.approx(P99["agent"] * (4 + 3 * 1.05) / 7, rel=0.01)   # the week's mean
        assert raised.new == pytest.approx(LIVE_P99)
        # Prometheus scrapes this daemon: its deploy info is there, under the labels the baseline joins on.
        history = PrometheusHistory(prometheus.url)
        deadline = time.monotonic() + DEADLINE_S
        while not history.query_range(f'{DEPLOY_INFO}{{host="{HOST}",deploy_id="v43"}}', time.time() - 30,
                                      time.time(), 1):
            assert time.monotonic() < deadline, f"{DEPLOY_INFO} of the live daemon never reached Prometheus"
            time.sleep(0.5)

        prometheus.stop()       # the local store answers: the same 0.3 s, so the alert clears
        step_until(daemon, clock, lambda: drift_entries(daemon, Outcome.ALERT_CLEARED), PROMETHEUS_REFRESH_S + 60)
        cleared = drift_entries(daemon, Outcome.ALERT_CLEARED)[0]
        assert cleared.old == pytest.approx(LIVE_P99)
        step_until(daemon, clock, lambda: clock[0] - cleared.t > 300, 400)   # Prometheus asked again, still down
        down = [r for r in caplog.records if "reads its baseline from the local store" in r.getMessage()]
        assert len(down) == 1, [r.getMessage() for r in down]
        assert f"Prometheus at {prometheus.url}" in down[0].getMessage() and "not reachable" in down[0].getMessage()
        assert str(tmp_path / "baselines.sqlite") in down[0].getMessage()

        prometheus.start()      # back: the baseline is Prometheus' again, and so is the alert
        step_until(daemon, clock, lambda: len(drift_entries(daemon, Outcome.ALERT_RAISED)) == 2,
                   PROMETHEUS_REFRESH_S + 60)
        assert drift_entries(daemon, Outcome.ALERT_RAISED)[1].old == pytest.approx(raised.old, rel=0.01)
        back = [r for r in caplog.records if "answers again" in r.getMessage()]
        assert len(back) == 1 and len([r for r in caplog.records if "local store" in r.getMessage()]) == 1
    finally:
        daemon.close()


def test_baseline_source_is_checked_at_start(tmp_path):
    def load(daemon_table):
        (tmp_path / "slotune.toml").write_text(f"[daemon]\n{daemon_table}\n[services.gw]\nport = 8080\n")
        return config.load(tmp_path / "slotune.toml")
    assert load("").baseline_source == "local"
    assert load('baseline_source = "prometheus"\nprometheus_url = "http://p:9090"').baseline_source == "prometheus"
    with pytest.raises(config.ConfigError, match=r'daemon.baseline_source: "prometheus" needs daemon.prometheus_url'):
        load('baseline_source = "prometheus"')
    with pytest.raises(config.ConfigError, match="daemon.baseline_source: 'thanos' is not one of local, prometheus"):
        load('baseline_source = "thanos"')
