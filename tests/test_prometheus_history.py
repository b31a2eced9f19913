"""Prometheus as the baseline history: a real Prometheus scrapes a real exporter
of a histogram with known observations; the quantile series must match them."""
import socket
import subprocess
import threading
import time
from urllib.request import urlopen

import pytest
from prometheus_client import CollectorRegistry, Histogram, start_http_server

from daemon.store.baselines import BaselineStore
from daemon.store.prometheus_history import PrometheusError, PrometheusHistory

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
    uniform over 0..1 s, so its P90 is 0.9 s and its P50 0.5 s."""
    registry = CollectorRegistry()
    latency = Histogram(HISTOGRAM, "request latency", ["service"], buckets=BUCKETS, registry=registry)
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


@pytest.fixture(scope="module")
def history(prometheus):
    """The history once Prometheus holds enough scrapes for a rate: polled, with a deadline."""
    history = PrometheusHistory(prometheus)
    deadline = time.monotonic() + DEADLINE_S
    while len(history.quantile_series(HISTOGRAM, "svc", 0.9, time.time() - 60, time.time(), 1, 5)) < 5:
        assert time.monotonic() < deadline, f"no {HISTOGRAM} quantiles from {prometheus} in {DEADLINE_S} s"
        time.sleep(0.5)
    return history


def test_quantile_series_matches_the_observations(history):
    now = float(int(time.time()))
    for q, expected in ((0.9, 0.9), (0.5, 0.5)):
        series = history.quantile_series(HISTOGRAM, "svc", q, now - 60, now, 1, window_s=5)
        assert len(series) >= 3
        assert all(now - 60 <= t <= now for t, _ in series)
        assert all(value == pytest.approx(expected, abs=0.03) for _, value in series), series


def test_a_service_without_data_has_an_empty_history(history):
    assert history.quantile_series(HISTOGRAM, "other", 0.9, time.time() - 60, time.time(), 1) == []


def test_long_ranges_are_fetched_in_chunks_prometheus_accepts(history):
    now = float(int(time.time()))
    series = history.quantile_series(HISTOGRAM, "svc", 0.9, now - 2 * 3600, now, 0.5, window_s=5)  # 14 400 steps
    assert series and series[-1][1] == pytest.approx(0.9, abs=0.03)


def test_import_into_the_baseline_store(history, tmp_path):
    now = float(int(time.time()))
    with BaselineStore(tmp_path / "b.sqlite") as store:
        args = dict(histogram=HISTOGRAM, q=0.9, start=now - 60, end=now, step=1, window_s=5,
                    environment="production", deploy_id="v1")
        imported = history.import_into(store, "svc", "p90_seconds", **args)
        assert history.import_into(store, "svc", "p90_seconds", **args) == imported  # again: replaces
        summary = store.summary("svc", "p90_seconds", "production", "v1")
    assert imported >= 3 and summary.count == imported
    assert summary.mean == pytest.approx(0.9, abs=0.03)


def test_errors_name_the_url_and_the_query(prometheus):
    with pytest.raises(PrometheusError, match=r"Prometheus at .+, query sum\(: HTTP 400: .*parse error"):
        PrometheusHistory(prometheus).query_range("sum(", 0, 10, 1)
    down = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(PrometheusError, match=rf"Prometheus at {down}, query histogram_quantile\(0.99, .*not reachable"):
        PrometheusHistory(down).quantile_series(HISTOGRAM, "svc", 0.99, 0, 10, 1)
    with pytest.raises(ValueError, match="not a Prometheus metric name"):
        PrometheusHistory(prometheus).quantile_series("bad name", "svc", 0.99, 0, 10, 1)
