"""Pushes SGLang scheduler settings that the server lets change live: `POST
/set_internal_state` with {"server_args": {key: value}} (bearer admin key from
token_file when the server has one), answered by a list of one `true` per data-
parallel rank (newer servers: an object with "success"), read back from `GET
/get_server_info` (the key in every rank's "internal_states" entry, else the
top-level server argument); a push that does not read back is set back.
Endpoints: docs.sglang.io basic_usage/native_api.html and
sgl-project/sglang python/sglang/srt/entrypoints/http_server.py (set_internal_state,
get_server_info); which keys are live depends on the server's version."""
from __future__ import annotations

from slotune.actuators import (ActuatorError, Control, Option, Targets, as_settings, http_url, numeric_settings,
                              on_service, plain, verified)
from slotune.actuators.http_json import call_json
from slotune.profiles.sglang import target_error as target_error


KIND = "sglang"
OPTIONS = {"url": Option("an http(s) URL: its server", required=True, check=http_url),
           "token_file": Option("a file holding its API key")}
TARGETS = Targets('max_running_requests = "max_running_requests"')


def from_control(control: Control, owns=None) -> "SglangActuator":
    return SglangActuator(control.options["url"], control.targets, control.options["token_file"])


class SglangActuator:
    def __init__(self, url: str, targets: dict[str, str], token_file: str = "", timeout_s: float = 5.0):
        self.url, self.targets = url.rstrip("/"), dict(targets)
        self.token_file, self.timeout_s = token_file, timeout_s

    def _in_force(self) -> dict[str, float]:
        """Server arguments by SGLang's names: top level, overridden by what every rank reports."""
        where = f"GET {self.url}/get_server_info"
        info = call_json(self.url + "/get_server_info", "GET", None, self.token_file, self.timeout_s)
        values = numeric_settings(info, where)
        ranks = info.get("internal_states") or []
        if not isinstance(ranks, list) or not all(isinstance(r, dict) for r in ranks):
            raise ActuatorError(f"{where}: internal_states is not a list of objects", unreachable=False)
        per_rank = [numeric_settings(r, f"{where}, internal_states") for r in ranks]
        for key in set().union(*per_rank) if per_rank else ():
            seen = {r.get(key) for r in per_rank}
            if len(seen) == 1 and (value := seen.pop()) is not None:
                values[key] = value
            else:    # ranks that disagree: no one value is in force
                values.pop(key, None)
        return values

    def current(self) -> dict[str, float]:
        return as_settings(self._in_force(), self.targets)

    def push(self, changes: dict[str, float]) -> None:
        wanted = on_service(changes, self.targets)
        before = self._in_force()
        missing = [k for k in wanted if k not in before]
        if missing:
            raise ActuatorError(f"GET {self.url}/get_server_info has no {missing[0]!r}: this SGLang has no such "
                                "server argument (check [control.targets]); nothing was set", unreachable=False)
        verified(changes, lambda: self._set(wanted), self.current, lambda: self._set({k: before[k] for k in wanted}),
                 f"GET {self.url}/get_server_info")

    def _set(self, values: dict[str, float]) -> None:
        url = self.url + "/set_internal_state"
        answer = call_json(url, "POST", {"server_args": {k: plain(v) for k, v in values.items()}},
                           self.token_file, self.timeout_s)
        ok = (isinstance(answer, list) and answer and all(a is True for a in answer)) or \
             (isinstance(answer, dict) and (answer.get("success") is True or answer.get("updated") is True))
        if not ok:
            raise ActuatorError(f"POST {url} did not take {sorted(values)}: the server answered "
                                f"{str(answer)[:200]}", unreachable=False)
