"""Pushes a Triton model's batching settings by loading the model with a config
override: `GET /v2/models/<m>/config` for the config in force, the changed
fields set in it, `POST /v2/repository/models/<m>/load` with {"parameters":
{"config": "<that config as JSON>"}} (Triton swaps the model in without losing
availability), read back from `GET /v2/models/<m>/config`; on a mismatch the
config from before is loaded again. A setting's target is the field's dotted
path (max_batch_size, dynamic_batching.max_queue_delay_microseconds); a setting
in ms pushed to a field in microseconds is scaled. Needs --model-control-mode=explicit.
Protocol: github.com/triton-inference-server/server docs/protocol/extension_model_repository.md
("Load", the "config" parameter) and extension_model_configuration.md; fields: model_config.proto."""
from __future__ import annotations

import copy
import json
import math
import re
from urllib.parse import quote

from slotune.actuators import ActuatorError, Control, Option, Targets, http_url, numeric_settings, verified
from slotune.actuators.http_json import call_json
from slotune.profiles.triton import target_error as target_error


KIND = "triton"
OPTIONS = {"url": Option("an http(s) URL: its HTTP endpoint", required=True, check=http_url),
           "model": Option("the model's name in Triton's repository", required=True),
           "token_file": Option("a file holding a bearer token for it")}
TARGETS = Targets('max_batch_size = "max_batch_size"')


def from_control(control: Control, owns=None) -> "TritonActuator":
    o = control.options
    return TritonActuator(o["url"], o["model"], control.targets, o["token_file"])


def _scale(setting: str, field: str) -> float:
    """How many of the field's units one of the setting's is (ms -> microseconds: 1000)."""
    return 1000.0 if setting.endswith("_ms") and field.endswith("_microseconds") else 1.0


class TritonActuator:
    """url: Triton's HTTP endpoint, e.g. http://127.0.0.1:8000; targets: setting -> field path
    (a setting without one is the top-level field of its own name)."""

    def __init__(self, url: str, model: str, targets: dict[str, str], token_file: str = "", timeout_s: float = 30.0):
        self.url, self.model, self.targets = url.rstrip("/"), model, dict(targets)
        self.token_file, self.timeout_s = token_file, timeout_s
        self.config_url = f"{self.url}/v2/models/{quote(model, safe='')}/config"

    def _config(self) -> dict:
        config = call_json(self.config_url, "GET", None, self.token_file, self.timeout_s)
        if not isinstance(config, dict) or config.get("name") != self.model:
            raise ActuatorError(f"GET {self.config_url}: expected model {self.model!r}'s config "
                                f"(an object with \"name\": {self.model!r})", unreachable=False)
        return config

    def _field(self, setting: str) -> list[str]:
        return self.targets.get(setting, setting).split(".")

    def _values(self, config: dict) -> dict[str, float]:
        out = numeric_settings(config, f"GET {self.config_url}")
        for setting in self.targets:
            value = _get(config, self._field(setting))
            if value is not None:
                out[setting] = value / _scale(setting, self.targets[setting])
        return out

    def current(self) -> dict[str, float]:
        return self._values(self._config())

    def push(self, changes: dict[str, float]) -> None:
        before = self._config()
        config = copy.deepcopy(before)
        for setting, value in changes.items():
            path, scaled = self._field(setting), value * _scale(setting, self.targets.get(setting, setting))
            if not (math.isfinite(scaled) and scaled >= 0 and float(scaled).is_integer()):
                raise ActuatorError(f"setting {setting} = {value:g}: Triton's {'.'.join(path)} is a whole number "
                                    f">= 0; set integer = true in its [settings] table; nothing was loaded",
                                    unreachable=False)
            _set(config, path, int(scaled))
        verified(changes, lambda: self._load(config), self.current, lambda: self._load(before),
                 f"GET {self.config_url}")

    def _load(self, config: dict) -> None:
        call_json(f"{self.url}/v2/repository/models/{quote(self.model, safe='')}/load", "POST",
                  {"parameters": {"config": json.dumps(config)}}, self.token_file, self.timeout_s)


def _get(config: dict, path: list[str]) -> float | None:
    """The number at path; Triton's JSON writes 64-bit fields as strings ("100")."""
    for key in path:
        if not isinstance(config, dict) or key not in config:
            return None
        config = config[key]
    if isinstance(config, str) and re.fullmatch(r"[0-9]{1,19}", config):
        return float(config)
    if isinstance(config, bool) or not isinstance(config, (int, float)):
        return None
    return numeric_settings({path[-1]: config}, "Triton's model config")[path[-1]]


def _set(config: dict, path: list[str], value: int) -> None:
    for key in path[:-1]:
        if not isinstance(config.get(key), dict):
            raise ActuatorError(f"Triton's model config has no {key!r} section for {'.'.join(path)} "
                                "(e.g. dynamic_batching must be on in config.pbtxt); nothing was loaded",
                                unreachable=False)
        config = config[key]
    config[path[-1]] = str(value) if isinstance(config.get(path[-1]), str) else value
