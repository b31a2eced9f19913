"""A tuner is one module: in a copy of the tree, a toy tuner added as
tuners/toy.py alone is taken by the config (its own key checked against its
range), run by the control loop through a real file actuator, and audited; and
nothing else in the tree changed (`git status` names only the new file)."""

from tests.conftest import changed, copy_of_the_tree, run_in

TOY = '''"""Toy tuner: halves (by its `factor`) the setting `toy_knob` while P99 is over the SLO."""
from __future__ import annotations

from dataclasses import dataclass

from slotune.tuners.base import Decision, Option, Policy, Spec, changed, setting

INTERVAL_S = 1.0
SPEC = Spec(("toy_knob",), options=(Option("factor", 0.5, 0.1, 0.9, "what a cut keeps"),))


@dataclass(frozen=True)
class Observation:
    now: float
    p99_s: float
    slo_s: float
    factor: float


def observe(i) -> Observation:
    return Observation(i.now, i.quantile(i.span.latency, 0.99), i.conf.spec.slo_p99_s, i.options["factor"])


def _decide(state, obs: Observation):
    if obs.p99_s <= obs.slo_s:
        return state, Decision({}, "within the SLO")
    return state, Decision(changed(state, state * obs.factor, "toy_knob"), "P99 over the SLO: cut")


POLICIES = {"slotune": Policy("slotune", "cut while over the SLO",
                              lambda settings: setting(settings, "toy_knob", "toy"), _decide)}
'''

RUN = '''
import json, sys
import numpy as np
from pathlib import Path
from slotune import config
from slotune.actuators.file import FileActuator
from slotune.control.loop import ControlLoop
from slotune.model.histogram import Histogram
from slotune.model.interval import Interval
from slotune.model.window import Window
from slotune.store.audit import AuditLog

work = Path(sys.argv[1])
settings = work / "settings.json"
settings.write_text(json.dumps({"toy_knob": 80.0}))
(work / "slotune.toml").write_text(f"""
[services.api]
cmdline = "api"
slo_p99_ms = 200
[services.api.control]
kind = "file"
path = "{settings}"
[services.api.settings.toy_knob]
min = 1
max = 100
max_step = 100
[services.api.tuners.toy]
factor = 0.25
""")
cfg = config.load(work / "slotune.toml")
loop = ControlLoop(cfg, {"api": FileActuator(str(settings))}, AuditLog(work / "audit.jsonl"), False)
slow = Window("api", 0.0, 1.0, 0.2, latency=Histogram.from_values(np.full(50, 0.5e9)), latency_source="service")
entries = loop.tick(Interval.at(1.0, {"api": [slow]}))
print(json.dumps([[e.tuner, e.setting, e.old, e.new, e.outcome] for e in entries]))
print(json.loads(settings.read_text())["toy_knob"])
'''


def test_a_toy_tuner_added_as_one_module_runs_and_changes_nothing_else(tmp_path):
    tree = copy_of_the_tree(tmp_path)
    (tree / "tuners" / "toy.py").write_text(TOY)
    work = tmp_path / "work"
    work.mkdir()
    entries, knob = run_in(tree, RUN, str(work))
    assert entries == '[["toy", "toy_knob", 80.0, 20.0, "pushed"]]' and float(knob) == 20.0
    assert changed(tree) == "?? tuners/toy.py\n"
