"""An actuator is one module: in a copy of the tree, a toy actuator added as
daemon/actuators/toy.py alone is taken by the config (its own key required,
any other refused naming the ones it takes), built for the service, and pushes
a throttle decision through the control loop; and `git status` names only the
new file."""
import json

from tests.conftest import changed, copy_of_the_tree, run_in

TOY = '''"""Toy actuator: keeps a service's settings as JSON in one file, rewritten whole."""
from __future__ import annotations

import json
from pathlib import Path

from slotune.actuators import ActuatorError, Control, Option, numeric_settings, verified

KIND = "toy"
OPTIONS = {"path": Option("the file its settings are kept in", required=True)}
TARGETS = None


def from_control(control: Control, owns=None) -> "ToyActuator":
    return ToyActuator(Path(control.options["path"]))


class ToyActuator:
    def __init__(self, path: Path):
        self.path = path

    def current(self) -> dict[str, float]:
        try:
            return numeric_settings(json.loads(self.path.read_text()), str(self.path))
        except (OSError, ValueError) as exc:
            raise ActuatorError(f"{self.path}: {exc}", unreachable=True) from None

    def push(self, changes: dict[str, float]) -> None:
        before = self.current()
        verified(changes, lambda: self.path.write_text(json.dumps({**before, **changes})), self.current,
                 lambda: self.path.write_text(json.dumps(before)), str(self.path))
'''

RUN = '''
import json, sys
import numpy as np
from pathlib import Path
from slotune import config
from slotune.actuators import for_control
from slotune.control.loop import ControlLoop
from slotune.model.histogram import Histogram
from slotune.model.interval import Interval
from slotune.model.window import Window
from slotune.store.audit import AuditLog

work = Path(sys.argv[1])
settings = work / "settings.json"
settings.write_text(json.dumps({"rate_limit_rps": 100.0}))
text = f"""
[services.api]
cmdline = "api"
slo_p99_ms = 200
[services.api.control]
kind = "toy"
path = "{settings}"
[services.api.settings.rate_limit_rps]
min = 1
max = 1000
max_step = 100
[services.api.tuners.throttle]
policy = "whitepaper"
"""
(work / "slotune.toml").write_text(text.replace('path = ', 'url = "http://h"\\npath = '))
try:
    config.load(work / "slotune.toml")
except config.ConfigError as exc:
    print(exc.key, "|", exc.reason)
(work / "slotune.toml").write_text(text)
cfg = config.load(work / "slotune.toml")
actuators = {s.name: for_control(s.control) for s in cfg.services}
loop = ControlLoop(cfg, actuators, AuditLog(work / "audit.jsonl"), False)
slow = Window("api", 0.0, 1.0, 0.2, latency=Histogram.from_values(np.full(50, 0.5e9)), latency_source="service")
print(json.dumps([[e.setting, e.old, e.new, e.outcome] for e in loop.tick(Interval.at(1.0, {"api": [slow]}))]))
'''


def test_a_toy_actuator_added_as_one_module_pushes_and_changes_nothing_else(tmp_path):
    tree = copy_of_the_tree(tmp_path)
    (tree / "daemon" / "actuators" / "toy.py").write_text(TOY)
    work = tmp_path / "work"
    work.mkdir()
    refused, pushed = run_in(tree, RUN, str(work))
    assert refused == "services.api.control.url | unknown key; the toy actuator takes kind, path"
    assert pushed == '[["rate_limit_rps", 100.0, 90.0, "pushed"]]'
    assert json.loads((work / "settings.json").read_text()) == {"rate_limit_rps": 90.0}
    assert changed(tree) == "?? daemon/actuators/toy.py\n"
