"""Pushes runtime values into Envoy through its admin interface: one `POST
/runtime_modify?key=value&...` for the whole decision, read back from `GET
/runtime` (each key's final_value); a push that does not read back is undone
with the values from before (a key that had none gets the empty value, which
removes it). Each setting is a runtime key, e.g. the adaptive concurrency
filter's or a circuit breaker's (`circuit_breakers.<cluster>.default.max_requests`).
Endpoints: envoyproxy.io/docs/envoy/latest/operations/admin ("POST /runtime_modify",
"GET /runtime"); keys: .../configuration/operations/runtime and each filter's "Runtime" section."""
from __future__ import annotations

import math
from urllib.parse import urlencode

from slotune.actuators import ActuatorError, Control, Option, Targets, as_settings, http_url, on_service, plain, verified
from slotune.actuators.http_json import call, call_json
from slotune.profiles.envoy import target_error as target_error


KIND = "envoy"
OPTIONS = {"url": Option("an http(s) URL: its admin interface", required=True, check=http_url),
           "token_file": Option("a file holding a bearer token for it")}
TARGETS = Targets('concurrency_limit = "circuit_breakers.CLUSTER.default.max_requests"')


def from_control(control: Control, owns=None) -> "EnvoyActuator":
    return EnvoyActuator(control.options["url"], control.targets, control.options["token_file"])


class EnvoyActuator:
    """url: the admin interface, e.g. http://127.0.0.1:9901; targets: setting -> runtime key."""

    def __init__(self, url: str, targets: dict[str, str], token_file: str = "", timeout_s: float = 2.0):
        self.url, self.targets = url.rstrip("/"), dict(targets)
        self.token_file, self.timeout_s = token_file, timeout_s

    def _runtime(self) -> dict[str, str]:
        """Runtime key -> its final value as Envoy reports it."""
        answer = call_json(self.url + "/runtime", "GET", None, self.token_file, self.timeout_s)
        entries = answer.get("entries") if isinstance(answer, dict) else None
        if not isinstance(entries, dict) or not all(isinstance(e, dict) for e in entries.values()):
            raise ActuatorError(f"GET {self.url}/runtime: expected Envoy's {{\"entries\": {{key: {{\"final_value\"..."
                                "}}}} object", unreachable=False)
        return {k: str(e.get("final_value", "")) for k, e in entries.items()}

    def current(self) -> dict[str, float]:
        return as_settings({k: v for k, text in self._runtime().items() if (v := _number(text)) is not None},
                           self.targets)

    def push(self, changes: dict[str, float]) -> None:
        before = self._runtime()
        wanted = on_service(changes, self.targets)
        verified(changes, lambda: self._modify({k: str(plain(v)) for k, v in wanted.items()}), self.current,
                 lambda: self._modify({k: before.get(k, "") for k in wanted}), f"GET {self.url}/runtime")

    def _modify(self, values: dict[str, str]) -> None:
        answer = call(f"{self.url}/runtime_modify?{urlencode(values)}", "POST", b"", self.token_file, self.timeout_s)
        if answer.strip() != b"OK":
            raise ActuatorError(f"POST {self.url}/runtime_modify: expected Envoy's OK, got "
                                f"{answer[:100].decode(errors='replace')!r}", unreachable=False)


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None
