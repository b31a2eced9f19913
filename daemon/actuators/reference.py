"""The reference stack's control surface: its services' `/admin/config`, whose GET
answers {"settings": {...}} and whose PATCH takes {key: value} (http_json.py)."""
from __future__ import annotations

from slotune.actuators import Control
from slotune.actuators.http_json import OPTIONS as OPTIONS
from slotune.actuators.http_json import HttpJsonActuator

KIND = "reference"
TARGETS = None


def from_control(control: Control, owns=None) -> HttpJsonActuator:
    o = control.options
    return HttpJsonActuator(o["url"], o["token_file"], o["method"], settings_key="settings")
