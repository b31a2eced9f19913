"""Prometheus as the baseline history: a real Prometheus scrapes a real exporter
of a histogram with known observations and of the daemon's slotune_deploy_info;
the quantile series must match them, under the exporter's deploy id."""
import re
import socket
import subprocess
import threading
import time
from urllib.request import urlopen

import pytest
from prometheus_client import CollectorRegistry, Gauge, Histogram, start_http_server

from slotune.store.baselines import BaselineStore
from slotune.store.prometheus_history import DEPLOY_INFO, PrometheusError, PrometheusHistory, history_query
from tests.conftest import run_slotune

HISTOGRAM = "slotune_http_request_duration_seconds"
BUCKETS = [round(0.1 * i, 1) for i in range(1, 11)]
DEADLINE_S = 40


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def exporter():
    """An in-process exporter whose service observes 0.005, 0.015, ... 0.995 s, over and over:
    uniform over 0..1 s, so its P90 is 0.9 s and its P50 0.5 s; beside it the deploy info
    of a daemon on host "h1" (deploy v1, production)."""
    registry = CollectorRegistry()
    latency = Histogram(HISTOGRAM, "request latency", ["service"], buckets=BUCKETS, registry=registry)
    Gauge(DEPLOY_INFO, "deploy", ["host", "environment", "deploy_id"], registry=registry).labels(
        "h1", "production", "v1").set(1)
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    stop = threading.Event()

    def observe():
        while not stop.wait(0.05):
            for i in range(100):
                latency.labels(service="svc").observe((i + 0.5) / 100)

    observer = threading.Thread(target=observe, daemon=True)
    observer.start()
    try:
        yield server.server_port
    finally:
        stop.set()
        observer.join()
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def prometheus(exporter, tmp_path_factory):
    folder = tmp_path_factory.mktemp("prometheus")
    (folder / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"scrape_configs: [{{job_name: svc, static_configs: [{{targets: ['127.0.0.1:{exporter}']}}]}}]\n")
    url = f"http://127.0.0.1:{free_port()}"
    proc = subprocess.Popen(["prometheus", f"--config.file={folder / 'prometheus.yml'}",
                             f"--storage.tsdb.path={folder / 'data'}", f"--web.listen-address={url[7:]}",
                             "--log.level=warn"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + DEADLINE_S
        while True:
            try:
                with urlopen(url + "/-/ready", timeout=1):
                    break
            except OSError:
                assert proc.poll() is None, f"prometheus exited: {proc.stderr.read().decode()}"
                assert time.monotonic() < deadline, "prometheus not ready"
                time.sleep(0.2)
        yield url
    finally:
        proc.kill()
        proc.wait()


def quantile(q: float, service: str = "svc", host: str = "h1", environment: str = "production") -> str:
    """The service's own histogram's q-quantile, rated over 5 s, labelled by the daemon's deploy info."""
    return history_query("p_seconds", service, host, environment, 5, histogram=HISTOGRAM, q=q)


@pytest.fixture(scope="module")
def history(prometheus):
    """The history once Prometheus holds enough scrapes for a rate: polled, with a deadline."""
    history = PrometheusHistory(prometheus)
    deadline = time.monotonic() + DEADLINE_S
    while len(history.by_deploy(quantile(0.9), time.time() - 60, time.time(), 1).get("v1", [])) < 5:
        assert time.monotonic() < deadline, f"no {HISTOGRAM} quantiles from {prometheus} in {DEADLINE_S} s"
        time.sleep(0.5)
    return history


def test_quantile_series_match_the_observations_under_the_deploy_id(history):
    now = float(int(time.time()))
    for q, expected in ((0.9, 0.9), (0.5, 0.5)):
        deploys = history.by_deploy(quantile(q), now - 60, now, 1)
        assert list(deploys) == ["v1"]
        assert len(deploys["v1"]) >= 3
        assert all(now - 60 <= t <= now for t, _ in deploys["v1"])
        assert all(value == pytest.approx(expected, abs=0.03) for _, value in deploys["v1"]), deploys


def test_another_service_host_or_environment_has_an_empty_history(history):
    for query in (quantile(0.9, service="other"), quantile(0.9, host="h2"), quantile(0.9, environment="staging")):
        assert history.by_deploy(query, time.time() - 60, time.time(), 1) == {}


def test_long_ranges_are_fetched_in_chunks_prometheus_accepts(history):
    now = float(int(time.time()))
    series = history.by_deploy(quantile(0.9), now - 2 * 3600, now, 0.5)["v1"]  # 14 400 steps
    assert series and series[-1][1] == pytest.approx(0.9, abs=0.03)


def test_import_into_the_baseline_store(history, tmp_path):
    now = float(int(time.time()))
    with BaselineStore(tmp_path / "b.sqlite") as store:
        args = dict(start=now - 60, end=now, step=1, environment="production")
        imported = history.import_into(store, "svc", "p90_seconds", quantile(0.9), **args)
        again = history.import_into(store, "svc", "p90_seconds", quantile(0.9), **args)
        summary = store.summary("svc", "p90_seconds", "production", "v1")
    assert len(imported["v1"]) >= 3 and summary.count == len(again["v1"])   # again: replaces, not doubles
    assert summary.mean == pytest.approx(0.9, abs=0.03)


def test_two_series_of_one_deploy_are_refused_naming_both(history):
    """As when two daemons on one hostname (two network namespaces of one machine) report the same host."""
    twice = f'label_replace({DEPLOY_INFO}, "instance", "10.0.0.2:9477", "", "") or {DEPLOY_INFO}'
    with pytest.raises(PrometheusError, match=r"two series for deploy 'v1' \(.*10.0.0.2:9477.* and .*\).*own hostname"):
        history.by_deploy(twice, time.time() - 10, time.time(), 1)


def test_errors_name_the_url_and_the_query(prometheus):
    with pytest.raises(PrometheusError, match=r"Prometheus at .+, query sum\(: HTTP 400: .*parse error"):
        PrometheusHistory(prometheus).query_range("sum(", 0, 10, 1)
    down = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(PrometheusError, match=rf"Prometheus at {down}, query histogram_quantile\(0.99, .*not reachable"):
        PrometheusHistory(down).by_deploy(quantile(0.99), 0, 10, 1)
    with pytest.raises(ValueError, match="not a Prometheus metric name"):
        history_query("p99", "svc", "h1", "production", 60, histogram="bad name")
    with pytest.raises(ValueError, match="no PromQL for metric 'p98'; known: latency_p50_seconds"):
        history_query("p98", "svc", "h1", "production", 60)


def test_cli_imports_a_quantile_of_the_services_own_histogram(history, prometheus, tmp_path):
    # Its --step 10s reads rates over 10 s at step-aligned times: wait until two such steps hold
    # scrapes (run first, the fixture's 5 s of history gave none, and the CLI rightly said so).
    query = history_query("p_seconds", "svc", "h1", "production", 10, histogram=HISTOGRAM, q=0.9)
    deadline = time.monotonic() + DEADLINE_S
    while len(history.by_deploy(query, time.time() - 60, time.time(), 10).get("v1", [])) < 2:
        assert time.monotonic() < deadline, "Prometheus held no 10 s rates"
        time.sleep(1.0)
    store = tmp_path / "b.sqlite"
    out = run_slotune("baseline", "import", "--from-prometheus", prometheus, "--service", "svc", "--host", "h1",
                      "--histogram", HISTOGRAM, "--metric", "latency_p90_seconds", "--since", "1m", "--step", "10s",
                      "--store", str(store))
    assert out.returncode == 0, out.stderr
    assert re.search(r"svc  latency_p90_seconds +\d+ points  mean 0\.9\d*  deploys v1 \(\d+\)", out.stdout), out.stdout
    with BaselineStore(store) as s:   # the quantile the metric's name says
        assert s.summary("svc", "latency_p90_seconds", "production", "v1").mean == pytest.approx(0.9, abs=0.03)
    unnamed = run_slotune("baseline", "import", "--from-prometheus", prometheus, "--service", "svc",
                          "--histogram", HISTOGRAM, "--metric", "slow_seconds", "--store", str(store))
    assert unnamed.returncode == 2 and "which quantile is slow_seconds? pass --quantile" in unnamed.stderr
