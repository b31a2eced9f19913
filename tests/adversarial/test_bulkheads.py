"""A bad service costs only itself: whatever one service's answers or samples make
happen inside the daemon (an exception nobody foresaw, a stage that overruns its
budget) is that service's stage failed for the tick, said once, exported and
backed off, while the other services are judged, decided and pushed as before.
Also the owed rollbacks that dry-run and reloads used to drop, and the steady
clock a wall-clock step cannot stall."""
import json
import logging
import socket
import time

import pytest
from prometheus_client import generate_latest

from slotune import config
from slotune.collectors.service_metrics import ServiceMetricsCollector
from slotune.actuators.http_json import HttpJsonActuator
from slotune.store.audit import AuditLog, Outcome
from slotune.control.loop import ControlLoop
from slotune.host.bulkheads import Bulkheads
from slotune.model.interval import Interval
from slotune.model.sample import Sample
from slotune.process import Daemon, SteadyClock
from tests.adversarial.service_double import ServiceDouble
from tests.adversarial.service_double import config as config_text
from tests.adversarial.test_decisions import RATE_TOML, rate_loop
from tests.test_control import window


class Exploding:
    """A control surface whose answer made the parser blow up in a way no one foresaw."""

    def current(self):
        raise RecursionError("maximum recursion depth exceeded while decoding a JSON array")

    def push(self, changes):
        raise AssertionError("never reached")


@pytest.fixture
def two(tmp_path):
    """A daemon watching two doubles, "good" and "bad", each with a throttle deciding every second."""
    good, bad = (ServiceDouble({"rate_limit_rps": 500.0, "concurrency_limit": 64}) for _ in range(2))
    one = config_text(good, 1, tmp_path).split("[services.svc]")
    services = "".join(f"[services.{name}]" + one[1].replace("services.svc.", f"services.{name}.")
                       .replace(str(good.port), str(double.port)) for name, double in (("good", good), ("bad", bad)))
    (tmp_path / "slotune.toml").write_text(one[0] + services)
    cfg = config.load(tmp_path / "slotune.toml")
    metrics = ServiceMetricsCollector()
    metrics.start([s.spec for s in cfg.services])
    daemon = Daemon(cfg, collectors=[metrics])
    yield daemon, good, bad
    daemon.close()
    good.close()
    bad.close()


def exported(daemon, name, **labels):
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in generate_latest(daemon.registry).decode().splitlines():
        if line.startswith(f"{name}{{{want}}} "):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_an_exception_in_one_services_control_leaves_the_other_tuned(two, caplog):
    daemon, good, bad = two
    daemon.control.services["bad"].actuator = Exploding()
    t0, now = 1000.0, [0.0]
    daemon.bulkheads.clock = lambda: now[0]      # the back-off's clock moves with the ticks
    with caplog.at_level(logging.DEBUG, logger="slotune.host.bulkheads"):
        for i in range(12):     # 6 s of ticks: the good service's throttle decides each second
            now[0] += 0.5
            daemon.step(t0 + i * 0.5, t0 + (i + 1) * 0.5)
    assert good.pushed() >= 4 and bad.pushed() == 0
    said = [r for r in caplog.records if r.levelno == logging.ERROR and "service bad: read failed" in r.message]
    assert len(said) == 1 and "RecursionError" in said[0].message and said[0].exc_info
    assert exported(daemon, "slotune_service_stage_up", service="bad", stage="read") == 0
    assert exported(daemon, "slotune_service_stage_up", service="good", stage="decide") == 1
    assert exported(daemon, "slotune_service_stage_failures_total", service="bad", stage="read") >= 2


def test_a_sample_that_breaks_the_window_costs_only_its_service(two):
    daemon, good, _ = two

    class Hostile:
        """A collector whose sample for "bad" carries what no window can be built from."""
        name, exports_samples, up = "hostile", False, True

        def collect(self, start, end):
            return [Sample("bad", self.name, start, end, histograms={("latency", ""): "not a histogram"})
                    for _ in range(2)]      # two of them: merging them raises

        def parts(self):
            return {}

    daemon.collectors.append(Hostile())
    for i in range(6):
        daemon.step(2000.0 + i * 0.5, 2000.0 + (i + 1) * 0.5)
    assert daemon.history["good"] and not daemon.history["bad"]
    assert not daemon.bulkheads.up("bad", "window") and daemon.bulkheads.up("good", "window")
    assert good.pushed() >= 1


def test_a_stage_over_its_budget_is_failed_and_backed_off():
    now = [0.0]
    heads = Bulkheads({"decide": 1.0}, clock=lambda: now[0])

    def slow():
        now[0] += 2.0
        return ["done"]
    assert heads.run("api", "decide", slow, []) == ["done"]        # what it did stands, but it is failed
    assert not heads.up("api", "decide")
    assert heads.run("api", "decide", lambda: ["again"], []) == []  # backed off: skipped
    now[0] += 1.0
    assert heads.run("api", "decide", lambda: ["again"], []) == ["again"] and heads.up("api", "decide")


def test_a_rollback_owed_is_pushed_under_dry_run(tmp_path):
    double = ServiceDouble({"rate_limit_rps": 100.0})
    try:
        control = rate_loop(tmp_path, double)
        history = [window(1.0, 0.1)]
        control.tick(Interval.at(1.0, {"api": history}))             # P99 under the SLO: x1.1
        assert double.settings["rate_limit_rps"] == pytest.approx(110)
        control.dry_run = True                                        # switched on while it is judged
        history.append(window(2.0, 0.5))                              # worse at the same load
        entries = control.tick(Interval.at(2.0, {"api": history}))
        assert Outcome.ROLLED_BACK in [e.outcome for e in entries]
        assert double.settings["rate_limit_rps"] == 100               # put back, not only said
        assert not control.services["api"].guard.pending
    finally:
        double.close()


def test_a_reload_that_drops_a_service_puts_back_its_changes_being_judged(tmp_path):
    double = ServiceDouble({"rate_limit_rps": 100.0})
    try:
        control = rate_loop(tmp_path, double)
        control.tick(Interval.at(1.0, {"api": [window(1.0, 0.1)]}))
        assert double.settings["rate_limit_rps"] == pytest.approx(110)
        entries = control.reconfigure(config.Config(path="t", services=()), {}, 1.5)
        assert [e.outcome for e in entries] == [Outcome.ROLLED_BACK]
        assert double.settings["rate_limit_rps"] == 100 and not control.services
    finally:
        double.close()


def test_the_steady_clock_ignores_a_step_of_the_wall_clock(monkeypatch, caplog):
    clock = SteadyClock()
    before = clock.now()
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() - 60.0)     # the wall clock steps back a minute
    with caplog.at_level(logging.WARNING, logger="slotune.process"):
        after, again = clock.now(), clock.now()
    assert 0 <= after - before < 1.0 and again >= after
    assert [r.message for r in caplog.records if "stepped" in r.message][0].startswith(
        "the wall clock stepped by -60")
    assert sum("stepped" in r.message for r in caplog.records) == 1


def test_a_push_is_owed_its_judgement_and_given_the_watchdogs_allowance_before_it_starts(tmp_path, monkeypatch):
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify"))
    notify.settimeout(5)
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "notify"))
    monkeypatch.setenv("WATCHDOG_USEC", "2000000")
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    double = ServiceDouble({"rate_limit_rps": 500.0, "concurrency_limit": 64})
    seen_at_push = []
    (tmp_path / "slotune.toml").write_text(config_text(double, 1, tmp_path))

    def at_push(n):     # what a kill during this push would leave behind
        seen_at_push.append(json.loads((tmp_path / "state.json").read_text()))
        return 200
    double.push_status = at_push
    daemon = Daemon(config.load(tmp_path / "slotune.toml"), collectors=[ServiceMetricsCollector()])
    daemon.collectors[0].start([s.spec for s in daemon.cfg.services])
    try:
        for i in range(6):
            daemon.step(3000.0 + i * 0.5, 3000.0 + (i + 1) * 0.5)
        assert double.pushed() >= 1
        pending = seen_at_push[0]["services"]["svc"]["pending"]
        assert [p["new"] for p in pending] == [double.pushes[0][p["setting"]] for p in pending]
        said = [notify.recv(4096) for _ in range(2)]
        assert said == [b"WATCHDOG=1\nWATCHDOG_USEC=150000000", b"WATCHDOG=1\nWATCHDOG_USEC=2000000"]
    finally:
        daemon.close()
        double.close()
        notify.close()


def test_control_surfaces_that_hang_do_not_hold_the_tick(tmp_path, serve):
    hung = [serve(lambda conn, _request, stopped: stopped.wait(30)) for _ in range(3)]
    double = ServiceDouble({"rate_limit_rps": 100.0})
    try:
        urls = {"api": f"http://127.0.0.1:{double.port}/admin/config"} | {
            f"hung{i}": f"http://127.0.0.1:{h.port}/admin/config" for i, h in enumerate(hung)}
        (tmp_path / "slotune.toml").write_text("".join(
            RATE_TOML.format(url=url, max=1000).replace("services.api", f"services.{name}")
            for name, url in urls.items()))
        cfg = config.load(tmp_path / "slotune.toml")
        control = ControlLoop(cfg, {name: HttpJsonActuator(url) for name, url in urls.items()},
                              AuditLog(None), False)
        began = time.monotonic()
        entries = control.tick(Interval.at(1.0, {name: [window(1.0, 0.1, service=name)] for name in urls}))
        took = time.monotonic() - began
        assert [e.service for e in entries] == ["api"] and double.pushed() == 1
        assert took < 1.0, took         # each hung read has a 2 s deadline: the tick did not wait for them
        assert set(control.reading) == {"hung0", "hung1", "hung2"}
        deadline = time.monotonic() + 10
        while not all(r.done() for r in control.reading.values()):     # the reads end by their deadline
            assert time.monotonic() < deadline
            time.sleep(0.05)
        control.tick(Interval.at(2.0, {name: [window(2.0, 0.1, service=name)] for name in urls}))
        assert not control.reading and not any(control.services[f"hung{i}"].reachable for i in range(3))
        assert control.services["hung0"].retry_at > 2.0                 # backed off, said once
    finally:
        double.close()
