"""/metrics and /status scraped as fast as they answer while the daemon steps:
every answer is whole (no "dictionary changed size during iteration", no 500),
because scrapes read what the last tick published, never the loop's own dicts."""
import threading
import time
import urllib.request

import pytest

from slotune import config
from slotune.collectors.service_metrics import ServiceMetricsCollector
from slotune.process import Daemon
from reference_stack import launcher
from tests.adversarial.service_double import ServiceDouble
from tests.adversarial.service_double import config as config_text

pytestmark = pytest.mark.slow


def test_scrapes_while_the_loop_steps(tmp_path):
    double = ServiceDouble({"rate_limit_rps": 500.0, "concurrency_limit": 64})
    port = launcher.free_ports(1)[0]
    (tmp_path / "slotune.toml").write_text(config_text(double, port, tmp_path))
    daemon = Daemon(config.load(tmp_path / "slotune.toml"), collectors=[ServiceMetricsCollector()])
    daemon.start()
    errors, answers, stop = [], [0], threading.Event()

    def scrape(path):
        while not stop.is_set():
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
                    assert resp.status == 200 and resp.read()
                answers[0] += 1
            except Exception as exc:      # any failure at all is what this test looks for
                errors.append(repr(exc))
    threads = [threading.Thread(target=scrape, args=(p,)) for p in ("/metrics", "/status", "/metrics")]
    for t in threads:
        t.start()
    try:
        t0 = time.time()
        for i in range(60):               # a minute of windows, in fast time
            daemon.step(t0 + i * 0.5, t0 + (i + 1) * 0.5)
    finally:
        stop.set()
        for t in threads:
            t.join()
        daemon.close()
        double.close()
    assert not errors, errors[:3]
    assert answers[0] > 50
