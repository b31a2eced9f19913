"""The control loop's guards, with a real file actuator (and a real closed
port for a control surface that is down) on hand-built windows."""
import json
from dataclasses import asdict, replace

import numpy as np
import pytest

from slotune import config
from slotune.actuators.file import FileActuator
from slotune.actuators.http_json import HttpJsonActuator
from slotune.store.audit import AuditLog, Entry, Outcome
from slotune.actuators import Control
from slotune.config import Bounds, Config, ServiceConf, TunerConf
from slotune.model.interval import Interval
from slotune.control.loop import ControlLoop, guarded
from slotune.model.histogram import Histogram
from slotune.model.service import ServiceSpec
from slotune.model.window import Window

SLO = 0.2


def window(t, p99_s, n=100, service="api"):
    """n requests in [t-1, t): most at 20 ms, the slowest 2 % at p99_s."""
    values = np.r_[np.full(n - n // 50, 20e6), np.full(n // 50, p99_s * 1e9)]
    return Window(service, t - 1, t, SLO, latency=Histogram.from_values(values), latency_source="service")


def service_conf(path, policy="whitepaper", max_step=50.0):
    return ServiceConf(ServiceSpec("api", cmdline="api", slo_p99_s=SLO),
                       control=Control("file", {"path": str(path), "pid_file": "", "signal": ""}),
                       tuners=(TunerConf("throttle", policy, 1.0),),
                       settings={"rate_limit_rps": Bounds(10.0, 1000.0, max_step)})


def loop(tmp_path, dry_run=False, max_step=50.0, start=100.0):
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"rate_limit_rps": start}))
    conf = service_conf(path, max_step=max_step)
    audit = AuditLog(tmp_path / "audit.jsonl")
    cfg = Config(path="test", services=(conf,))
    return ControlLoop(cfg, {"api": FileActuator(str(path))}, audit, dry_run), path, audit


def pushed(path):
    return json.loads(path.read_text())["rate_limit_rps"]


def test_guard_limits_the_step_then_the_bounds():
    b = Bounds(1.0, 100.0, 10.0)
    assert guarded(500.0, 50.0, b) == 60.0
    assert guarded(0.0, 5.0, b) == 1.0
    assert guarded(42.0, None, b) == 42.0
    assert guarded(6.7, 2.0, Bounds(1.0, 100.0, 10.0, integer=True)) == 7.0


def test_overload_pushes_the_whitepaper_decrease_within_the_largest_step(tmp_path):
    control, path, audit = loop(tmp_path, max_step=5.0)
    entries = control.tick(Interval.at(1.0, {"api": [window(1.0, 0.5)]}))
    assert [e.outcome for e in entries] == ["pushed"]
    assert pushed(path) == 95.0           # tuner wanted 90 (x0.9), the step allows 5
    assert "tuner wanted 90" in entries[0].reason
    lines = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert lines[0]["old"] == 100.0 and lines[0]["new"] == 95.0 and lines[0]["outcome"] == "pushed"


def test_dry_run_decides_and_audits_but_never_writes(tmp_path):
    control, path, audit = loop(tmp_path, dry_run=True)
    entries = control.tick(Interval.at(1.0, {"api": [window(1.0, 0.5)]}))
    assert [e.outcome for e in entries] == ["dry-run"] and entries[0].new == 90.0
    assert pushed(path) == 100.0


def test_a_tuner_decides_at_its_interval_on_ticks_that_jitter(tmp_path):
    # Ticks of 1 s that come a few ms late or early: a tuner of 2 s decides every 2 s, not 3.
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"rate_limit_rps": 100.0}))
    conf = replace(service_conf(path, max_step=1000.0), tuners=(TunerConf("throttle", "whitepaper", 2.0),))
    control = ControlLoop(Config(path="test", services=(conf,)), {"api": FileActuator(str(path))},
                          AuditLog(None), False)
    history, decided = [], []
    for t in (1.02, 2.0, 3.03, 4.01, 5.02, 6.0, 7.04, 8.02, 9.0, 10.03):
        history.append(window(t, 0.5))
        if control.tick(Interval.at(t, {"api": history})):
            decided.append(t)
    assert decided == [1.02, 3.03, 5.02, 7.04, 9.0]


def test_a_1_s_tuner_decides_on_every_1_s_tick_however_late_each_begins(tmp_path):
    # Each tick is stamped when it begins, 0..0.45 s after its time: two in a row can read
    # 0.55 s or 1.45 s apart. The whitepaper throttle raises its rate x1.1 at every decision
    # under the SLO, so each tick must push once: none skipped as "not due", none held as
    # "changed this interval".
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"rate_limit_rps": 100.0}))
    conf = replace(service_conf(path), settings={"rate_limit_rps": Bounds(10.0, 1e6, 1e6)})
    control = ControlLoop(Config(path="test", services=(conf,)), {"api": FileActuator(str(path))},
                          AuditLog(None), False)
    late = np.random.default_rng(5).uniform(0.0, 0.45, 50)
    late[10:20] = [0.45, 0.0] * 5       # the widest swings, one after another
    history, pushes = [], []
    for t in np.arange(1.0, 51.0) + late:
        history.append(window(float(t), 0.01))
        pushes.append(sum(e.outcome == "pushed" for e in control.tick(Interval.at(float(t), {"api": history}))))
    assert pushes == [1] * 50


def test_at_most_one_change_per_setting_per_interval(tmp_path):
    control, path, _ = loop(tmp_path)
    control.tick(Interval.at(1.0, {"api": [window(1.0, 0.5)]}))
    assert control.tick(Interval.at(1.5, {"api": [window(1.0, 0.5), window(1.5, 0.5)]})) == []
    assert pushed(path) == 90.0


def test_a_change_that_makes_p99_worse_at_the_same_load_is_rolled_back(tmp_path):
    control, path, audit = loop(tmp_path)
    history = [window(1.0, 0.1)]
    first = control.tick(Interval.at(1.0, {"api": history}))
    assert pushed(path) == pytest.approx(110.0) and first[0].outcome == "pushed"   # P99 under SLO: x1.1
    history.append(window(2.0, 0.5))                                  # worse, same load
    entries = control.tick(Interval.at(2.0, {"api": history}))
    outcomes = [e.outcome for e in entries]
    assert outcomes[0] == "rolled back" and pushed(path) == 100.0
    assert (Outcome.HELD, "rolled back recently") in [(e.outcome, e.detail) for e in entries[1:]]


def test_a_worse_p99_under_a_much_higher_load_is_not_blamed_on_the_change(tmp_path):
    control, path, _ = loop(tmp_path)
    history = [window(1.0, 0.1, n=100)]
    control.tick(Interval.at(1.0, {"api": history}))
    history.append(window(2.0, 0.5, n=300))
    entries = control.tick(Interval.at(2.0, {"api": history}))
    assert "rolled back" not in [e.outcome for e in entries]


def test_a_change_is_judged_by_the_first_interval_that_answered_requests(tmp_path):
    control, path, _ = loop(tmp_path)
    history = [window(1.0, 0.1)]
    control.tick(Interval.at(1.0, {"api": history}))
    history.append(window(2.0, 0.5, n=0))                             # nothing answered: not judged yet
    assert [e.outcome for e in control.tick(Interval.at(2.0, {"api": history}))
            if e.outcome in (Outcome.KEPT, Outcome.ROLLED_BACK)] == []
    history.append(window(3.0, 0.5))                                  # worse, same load
    entries = control.tick(Interval.at(3.0, {"api": history}))
    assert entries[0].outcome == Outcome.ROLLED_BACK and pushed(path) == 100.0


def test_a_change_followed_by_no_requests_is_kept_saying_so(tmp_path):
    control, path, _ = loop(tmp_path)
    history = [window(1.0, 0.1)]
    control.tick(Interval.at(1.0, {"api": history}))
    judged = []
    for t in (2.0, 3.0, 4.0):
        history.append(window(t, 0.5, n=0))
        judged += [e for e in control.tick(Interval.at(t, {"api": history})) if e.outcome == Outcome.KEPT]
    assert [(e.detail, e.t) for e in judged][0] == ("no request answered since the change to judge by", 4.0)


class CountingFile(FileActuator):
    """The file actuator, counting how often the settings in force are read back."""
    reads = 0

    def current(self):
        self.reads += 1
        return super().current()


def test_a_push_is_planned_on_the_settings_in_force_read_just_before(tmp_path, caplog):
    caplog.set_level("INFO", logger="slotune.control.loop")
    control, path, audit = loop(tmp_path, max_step=5.0)
    actuator = control.services["api"].actuator = CountingFile(str(path))
    history = [window(1.0, 0.1)]                       # P99 under the SLO: x1.1 wanted, 5 allowed
    assert [e.new for e in control.tick(Interval.at(1.0, {"api": history}))] == [105.0]
    assert actuator.reads == 1                         # read once: the push is planned on that read
    path.write_text(json.dumps({"rate_limit_rps": 200.0}))    # a person sets 200 by hand
    history.append(window(2.0, 0.1))
    entries = control.tick(Interval.at(2.0, {"api": history}))
    assert actuator.reads == 2                         # read within REFRESH_S, as it was about to push...
    assert Outcome.PUSHED not in [e.outcome for e in entries] and pushed(path) == 200.0   # ...on 105: not pushed
    assert "rate_limit_rps = 200 changed since the tuner decided" in caplog.text
    history.append(window(3.0, 0.1))
    entries = [e for e in control.tick(Interval.at(3.0, {"api": history})) if e.outcome == Outcome.PUSHED]
    assert [(e.old, e.new) for e in entries] == [(200.0, 205.0)] and pushed(path) == 205.0   # decided on 200


def test_a_dry_run_reads_the_settings_in_force_every_refresh_s(tmp_path):
    control, path, _ = loop(tmp_path, dry_run=True)
    actuator = control.services["api"].actuator = CountingFile(str(path))
    history = []
    for t in range(1, 12):
        history.append(window(float(t), 0.5))
        control.tick(Interval.at(float(t), {"api": history}))
    assert actuator.reads == 3                         # at 1, 6 and 11 s
    assert control.services["api"].read_at == 11.0


def test_control_surface_down_means_observe_only_with_back_off():
    conf = ServiceConf(ServiceSpec("api", cmdline="api", slo_p99_s=SLO),
                       control=Control("reference", {"url": "http://127.0.0.1:1/admin/config", "token_file": "", "method": "PATCH"}),
                       tuners=(TunerConf("throttle", "whitepaper", 1.0),),
                       settings={"rate_limit_rps": Bounds(10.0, 1000.0, 50.0)})
    control = ControlLoop(Config(path="t", services=(conf,)),
                          {"api": HttpJsonActuator(conf.control.options["url"], settings_key="settings")},
                          AuditLog(None), dry_run=False)
    assert control.tick(Interval.at(1.0, {"api": [window(1.0, 0.5)]})) == []
    sc = control.services["api"]
    assert not sc.reachable and sc.retry_at == pytest.approx(2.0)
    control.tick(Interval.at(2.0, {"api": [window(2.0, 0.5)]}))
    assert sc.retry_at == pytest.approx(4.0)     # 1 s, then 2 s, doubling to 60 s


def test_a_tuner_that_cannot_run_on_a_service_stops_alone_and_says_why(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"unrelated": 1}))     # no rate_limit_rps: the tuner cannot start
    conf = service_conf(path)
    audit = AuditLog(tmp_path / "audit.jsonl")
    control = ControlLoop(Config(path="t", services=(conf,)), {"api": FileActuator(str(path))}, audit, False)
    entries = control.tick(Interval.at(1.0, {"api": [window(1.0, 0.5)]}))
    assert (entries[0].outcome, entries[0].detail) == (Outcome.REFUSED, "tuner stopped")
    assert "rate_limit_rps" in entries[0].reason
    assert control.tick(Interval.at(3.0, {"api": [window(3.0, 0.5)]})) == []


def test_the_audit_log_keeps_the_outcome_words_its_readers_match_and_the_detail_beside(tmp_path):
    control, path, audit = loop(tmp_path)
    history = [window(1.0, 0.1)]
    control.tick(Interval.at(1.0, {"api": history}))
    history.append(window(2.0, 0.5))
    control.tick(Interval.at(2.0, {"api": history}))
    lines = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert [(e["outcome"], e["detail"]) for e in lines] == [
        ("pushed", ""), ("rolled back", ""), ("held", "rolled back recently")]
    assert [Outcome(e["outcome"]).label for e in lines] == ["pushed", "rolled_back", "held"]


def test_a_decision_reads_rounded_where_a_person_reads_it_and_exact_in_the_log():
    e = Entry(1.0, "gateway", "sampling", "trace_sample_rate", 0.1, 0.1 + 0.2, "why", Outcome.DRY_RUN)
    assert e.line() == "gateway.trace_sample_rate: 0.1 -> 0.3 (dry-run) because why"
    assert replace(e, old=64.0, new=0.0688499999999999).line().startswith("gateway.trace_sample_rate: 64 -> 0.06885 ")
    assert replace(e, old=None, new=123456.7).line().startswith("gateway.trace_sample_rate: none -> 123457 ")
    assert json.loads(json.dumps(asdict(e)))["new"] == 0.1 + 0.2


BUDGET_TOML = """
[services.gateway]
cmdline = "reference_stack gateway"
slo_p99_ms = 800
[services.gateway.control]
kind = "file"
path = "{path}"
[services.gateway.tuners.budget]
policy = "{policy}"
interval_s = 10
gateway_slo_ms = 100
tool_slo_ms = 300
llm_slo_ms = 400
[services.gateway.settings.tool_timeout_ms]
min = 10
max = 60000
max_step = 60000
[services.gateway.settings.llm_timeout_ms]
min = 10
max = 60000
max_step = 60000
"""


def budget_loop(tmp_path, policy):
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"tool_timeout_ms": 2000.0, "llm_timeout_ms": 30000.0}))
    (tmp_path / "slotune.toml").write_text(BUDGET_TOML.format(path=path, policy=policy))
    cfg = config.load(tmp_path / "slotune.toml")
    return ControlLoop(cfg, {"gateway": FileActuator(str(path))}, AuditLog(None), False), cfg, path


def gateway_window(t, rng):
    """A second of 50 queries timed by stage: gate, cache, tools (~100 ms) and llm (~300 ms)."""
    w = Window("gateway", t - 1, t, 0.8)
    for stage, median_ms, sigma in (("gate", 2, 0.2), ("cache", 3, 0.2), ("tools", 100, 0.4), ("llm", 300, 0.2)):
        values = rng.lognormal(np.log(median_ms * 1e6), sigma, 50)
        w.histograms[("gateway_stage_duration_seconds", f"stage={stage}")] = Histogram.from_values(values)
    return w


def test_the_config_takes_the_budget_tuner_and_the_loop_pushes_the_split_slo_as_timeouts(tmp_path):
    control, cfg, path = budget_loop(tmp_path, "whitepaper")
    assert cfg.service("gateway").tuners[0].options == {"gateway_slo_ms": 100.0, "tool_slo_ms": 300.0,
                                                        "llm_slo_ms": 400.0}
    entries = control.tick(Interval.at(10.0, {"gateway": [gateway_window(10.0, np.random.default_rng(1))]}))
    assert {e.setting: (e.outcome, e.new) for e in entries} == {
        "tool_timeout_ms": (Outcome.PUSHED, pytest.approx(300.0)),    # 300 / (100 + 300 + 400) of 800 ms
        "llm_timeout_ms": (Outcome.PUSHED, pytest.approx(400.0))}
    assert json.loads(path.read_text()) == {"tool_timeout_ms": pytest.approx(300.0),
                                            "llm_timeout_ms": pytest.approx(400.0)}


def test_slotune_budgets_follow_the_measured_hops_and_leave_the_gateway_its_share(tmp_path):
    control, _, path = budget_loop(tmp_path, "slotune")
    rng = np.random.default_rng(2)
    control.tick(Interval.at(10.0, {"gateway": [gateway_window(t, rng) for t in range(1, 11)]}))
    pushed = json.loads(path.read_text())
    p99_ms = {"tools": 100 * np.exp(0.4 * 2.326), "llm": 300 * np.exp(0.2 * 2.326)}   # 253 and 477
    assert pushed["tool_timeout_ms"] > p99_ms["tools"] and pushed["llm_timeout_ms"] > p99_ms["llm"]
    assert pushed["tool_timeout_ms"] + pushed["llm_timeout_ms"] < 800 - 5      # the gateway's own time kept
