"""The control loop's guards against what goes wrong around a decision, with a
real HTTP control surface that refuses on purpose: a two-setting decision whose
second push would fail, a hold on one of its settings, a tuner asking for NaN,
an audit log on /dev/full, a rollback that does not land, a tuner wound up
against its bound, and a restart right after a push."""
import json
import math

import numpy as np
import pytest

from slotune import config
from slotune.actuators.http_json import HttpJsonActuator
from slotune.store.audit import AuditLog, Outcome
from slotune.control.guard_state import GuardFile
from slotune.control.loop import ControlLoop
from slotune.model.interval import Interval
from tests.adversarial.service_double import ServiceDouble
from tests.test_control import BUDGET_TOML, gateway_window, window

RATE_TOML = """
[services.api]
port = 80
slo_p99_ms = 200
[services.api.control]
kind = "http-json"
url = "{url}"
[services.api.tuners.throttle]
policy = "whitepaper"
interval_s = 1
[services.api.settings.rate_limit_rps]
min = 10
max = {max}
max_step = 1000
"""


@pytest.fixture
def double():
    d = ServiceDouble({"tool_timeout_ms": 2000.0, "llm_timeout_ms": 30000.0, "rate_limit_rps": 100.0})
    yield d
    d.close()


def budget_loop(tmp_path, double, audit_path=None):
    (tmp_path / "slotune.toml").write_text(BUDGET_TOML.format(path="unused", policy="whitepaper").replace(
        'kind = "file"\npath = "unused"', f'kind = "http-json"\nurl = "http://127.0.0.1:{double.port}/admin/config"'))
    cfg = config.load(tmp_path / "slotune.toml")
    audit = AuditLog(audit_path or tmp_path / "audit.jsonl")
    actuator = HttpJsonActuator(cfg.service("gateway").control.options["url"])
    return ControlLoop(cfg, {"gateway": actuator}, audit, False), audit


def rate_loop(tmp_path, double, bound=1000.0, guards=None):
    (tmp_path / "slotune.toml").write_text(RATE_TOML.format(url=f"http://127.0.0.1:{double.port}/admin/config",
                                                            max=bound))
    cfg = config.load(tmp_path / "slotune.toml")
    actuator = HttpJsonActuator(cfg.service("api").control.options["url"])
    return ControlLoop(cfg, {"api": actuator}, AuditLog(tmp_path / "audit.jsonl"), False, guards=guards)


def audit_lines(tmp_path):
    return [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]


def budget_tick(control, t=10.0):
    return control.tick(Interval.at(t, {"gateway": [gateway_window(t, np.random.default_rng(1))]}))


def test_a_two_setting_decision_goes_out_as_one_call_when_a_second_push_would_fail(tmp_path, double):
    double.push_status = lambda n: 200 if n == 0 else 500     # any second call is refused
    control, _ = budget_loop(tmp_path, double)
    entries = budget_tick(control)
    assert [e.outcome for e in entries] == [Outcome.PUSHED, Outcome.PUSHED]
    assert double.pushes == [{"tool_timeout_ms": pytest.approx(300), "llm_timeout_ms": pytest.approx(400)}]
    assert not double.refused
    lines = audit_lines(tmp_path)
    assert len({line["decision"] for line in lines}) == 1 and lines[0]["decision"]


def test_a_two_setting_decision_that_fails_changes_nothing_and_says_so_for_both(tmp_path, double):
    double.push_status = lambda n: 503
    control, _ = budget_loop(tmp_path, double)
    entries = budget_tick(control)
    assert [e.outcome for e in entries] == [Outcome.PUSH_FAILED, Outcome.PUSH_FAILED]
    assert double.settings["tool_timeout_ms"] == 2000.0 and double.settings["llm_timeout_ms"] == 30000.0
    assert control.services["gateway"].settings["tool_timeout_ms"] == 2000.0
    lines = audit_lines(tmp_path)             # audited before the push, then what became of it
    assert [line["outcome"] for line in lines] == ["pushed", "pushed", "push failed", "push failed"]
    assert len({line["decision"] for line in lines}) == 1


def test_a_hold_on_one_setting_holds_the_whole_decision(tmp_path, double):
    control, _ = budget_loop(tmp_path, double)
    control.services["gateway"].guard.held_until["llm_timeout_ms"] = 1e9
    entries = budget_tick(control)
    assert [(e.outcome, e.detail) for e in entries] == [(Outcome.HELD, "rolled back recently")] * 2
    assert double.pushes == [] and double.refused == []


@pytest.mark.parametrize("wanted", [math.nan, math.inf, -math.inf])
def test_a_tuner_asking_for_a_non_finite_value_is_refused_and_audited(tmp_path, double, wanted):
    control, _ = budget_loop(tmp_path, double)
    sc = control.services["gateway"]
    control._refresh(sc, 10.0)
    recent = Interval.at(10.0, {"gateway": [gateway_window(10.0, np.random.default_rng(1))]}).since("gateway", 0)
    entries = control._apply(sc, sc.conf.tuners[0], 10.0, {"tool_timeout_ms": wanted, "llm_timeout_ms": 400.0},
                             "hostile", recent)
    assert {e.outcome for e in entries} == {Outcome.REFUSED} and "not a finite number" in entries[0].detail
    assert double.pushes == [] and [line["outcome"] for line in audit_lines(tmp_path)] == ["refused"] * 2


def test_an_audit_log_on_dev_full_pushes_nothing(tmp_path, double):
    control, audit = budget_loop(tmp_path, double, audit_path="/dev/full")
    assert budget_tick(control) == []
    assert double.pushes == [] and control.audit_failures == 1


def test_a_rollback_that_does_not_land_is_retried_until_it_does(tmp_path, double):
    control = rate_loop(tmp_path, double)
    history = [window(1.0, 0.1)]
    control.tick(Interval.at(1.0, {"api": history}))                   # P99 under the SLO: x1.1
    assert double.settings["rate_limit_rps"] == pytest.approx(110)
    double.push_status = lambda n: 503                                 # the surface refuses the rollback
    history.append(window(2.0, 0.5))                                   # worse at the same load
    entries = control.tick(Interval.at(2.0, {"api": history}))
    assert Outcome.ROLLBACK_FAILED in [e.outcome for e in entries]
    assert control.services["api"].guard.rollbacks_owed
    double.push_status = lambda n: 200
    later = []
    for t in (3.0, 4.0):                                               # the back-off lets it retry
        history.append(window(t, 0.5))
        later += control.tick(Interval.at(t, {"api": history}))
    assert Outcome.ROLLED_BACK in [e.outcome for e in later] and double.settings["rate_limit_rps"] == 100
    assert not control.services["api"].guard.rollbacks_owed


def test_the_throttle_recovers_within_two_intervals_after_a_clip_at_its_bound(tmp_path, double):
    control = rate_loop(tmp_path, double, bound=120.0)
    history = []
    for t in range(1, 9):                       # good windows: x1.1 each time, clipped at 120 from the 2nd
        history.append(window(float(t), 0.1))
        control.tick(Interval.at(float(t), {"api": history}))
    assert double.settings["rate_limit_rps"] == 120
    for t in (9.0, 10.0):                       # overload: x0.9 from what is in force, not from 120 x 1.1^6
        history.append(window(t, 0.5, n=100))
        control.tick(Interval.at(t, {"api": history}))
    assert double.settings["rate_limit_rps"] < 120


def test_a_restart_right_after_a_push_still_judges_it(tmp_path, double):
    control = rate_loop(tmp_path, double)
    history = [window(1.0, 0.1)]
    control.tick(Interval.at(1.0, {"api": history}))
    state = GuardFile(tmp_path / "state.json")
    state.save(control.guards())                          # what the daemon does after each tick
    restarted = rate_loop(tmp_path, double, guards=state.load())
    entries = restarted.tick(Interval.at(2.0, {"api": [window(2.0, 0.5)]}))
    assert entries[0].outcome == Outcome.ROLLED_BACK and double.settings["rate_limit_rps"] == 100
    held = restarted.tick(Interval.at(3.0, {"api": [window(2.0, 0.5), window(3.0, 0.1)]}))
    assert [e.outcome for e in held] == [Outcome.HELD]    # the hold came through the restart too


def test_the_guards_are_written_again_only_when_they_change(tmp_path, double):
    control = rate_loop(tmp_path, double)
    control.tick(Interval.at(1.0, {"api": [window(1.0, 0.1)]}))
    state = GuardFile(tmp_path / "state.json")
    state.save(control.guards())
    written = state.path.stat().st_ino                    # each write is a new file renamed over the old
    state.save(control.guards())
    assert state.path.stat().st_ino == written            # nothing changed: not rewritten
    control.guards()["api"].held_until["rate_limit_rps"] = 99.0
    state.save(control.guards())
    assert state.load()["api"].held_until == {"rate_limit_rps": 99.0}


def test_small_steps_on_a_whole_number_setting_still_add_up(tmp_path, double):
    # The state's 3.3 is its finer reading of the 3 in force, not wind-up: it is kept, so
    # x1.1 steps from 3 reach 4 (resynced to 3 each time, they would round back to 3 forever).
    (tmp_path / "slotune.toml").write_text(RATE_TOML.format(url=f"http://127.0.0.1:{double.port}/admin/config",
                                                            max=1000).replace(
        "min = 10\nmax = 1000\nmax_step = 1000", "min = 1\nmax = 1000\nmax_step = 1000\ninteger = true"))
    cfg = config.load(tmp_path / "slotune.toml")
    double.settings["rate_limit_rps"] = 3.0
    control = ControlLoop(cfg, {"api": HttpJsonActuator(cfg.service("api").control.options["url"])},
                          AuditLog(tmp_path / "audit.jsonl"), False)
    history = []
    for t in range(1, 6):
        history.append(window(float(t), 0.1))
        control.tick(Interval.at(float(t), {"api": history}))
    assert cfg.service("api").settings["rate_limit_rps"].integer
    assert double.settings["rate_limit_rps"] >= 4
