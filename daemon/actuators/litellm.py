"""Pushes a LiteLLM proxy virtual key's limits: `POST /key/update` with {"key":
<the key>, "max_parallel_requests": N, "rpm_limit": N, ...} as the proxy's
admin (bearer master key from token_file), read back from `GET
/key/info?key=<the key>` ("info"); a push that does not read back is set back
to the values from before (a limit that was unset goes back to null). The
virtual key is read from key_file and never appears in a message. rpm_limit and
tpm_limit count per minute and slotune's rates per second: a rate goes out x60,
rounded to a whole number per minute, and reads back /60.
Endpoints: docs.litellm.ai/docs/proxy/virtual_keys ("Update Key", "Key Info") and the
proxy's API reference for /key/update and /key/info."""
from __future__ import annotations

from urllib.parse import quote

from slotune.actuators import (ActuatorError, Control, Option, Targets, as_settings, http_url, numeric_settings,
                              on_service, plain, verified)
from slotune.actuators.http_json import call_json
from slotune.host.safe_files import read_token
from slotune.profiles.litellm import LIMITS
from slotune.profiles.litellm import target_error as target_error

PER_MINUTE = ("rpm_limit", "tpm_limit")


def _wire(limit: str, value: float) -> float:
    """A setting's value as the proxy holds it: a per-second rate as a whole number per minute (at least 1)."""
    return float(max(1, round(value * 60))) if limit in PER_MINUTE else value


def _setting(limit: str, value: float) -> float:
    return value / 60 if limit in PER_MINUTE else value


KIND = "litellm"
OPTIONS = {"url": Option("an http(s) URL: the proxy", required=True, check=http_url),
           "key_file": Option("the file that holds the virtual key (sk-...) whose limits are tuned", required=True),
           "token_file": Option("a file holding its master key")}
TARGETS = Targets('rate_limit_rps = "rpm_limit"')


def from_control(control: Control, owns=None) -> "LitellmActuator":
    o = control.options
    return LitellmActuator(o["url"], o["key_file"], control.targets, o["token_file"])


class LitellmActuator:
    def __init__(self, url: str, key_file: str, targets: dict[str, str], token_file: str = "",
                 timeout_s: float = 5.0):
        self.url, self.key_file, self.targets = url.rstrip("/"), key_file, dict(targets)
        self.token_file, self.timeout_s = token_file, timeout_s

    def _call(self, path: str, method: str, body=None):
        key = read_token(self.key_file)
        try:
            return call_json(self.url + path.replace("{key}", quote(key, safe="")), method,
                             {**body, "key": key} if body is not None else None, self.token_file, self.timeout_s)
        except ActuatorError as exc:
            raise ActuatorError(str(exc).replace(quote(key, safe=""), "<key>").replace(key, "<key>"),
                                exc.unreachable) from None

    def _info(self) -> dict:
        answer = self._call("/key/info?key={key}", "GET")
        info = answer.get("info") if isinstance(answer, dict) else None
        if not isinstance(info, dict):
            raise ActuatorError(f"GET {self.url}/key/info: expected LiteLLM's {{\"key\": ..., \"info\": {{...}}}}",
                                unreachable=False)
        return info

    def current(self) -> dict[str, float]:
        info = numeric_settings({k: self._info().get(k) for k in LIMITS}, f"GET {self.url}/key/info")
        return as_settings({k: _setting(k, v) for k, v in info.items()}, self.targets)

    def push(self, changes: dict[str, float]) -> None:
        wanted = on_service(changes, self.targets)
        unknown = [k for k in wanted if k not in LIMITS]
        if unknown:
            raise ActuatorError(f"setting {unknown[0]} is not a LiteLLM key limit ({', '.join(LIMITS)}): map it in "
                                "[control.targets]; nothing was updated", unreachable=False)
        wire = {k: _wire(k, v) for k, v in wanted.items()}
        expected = {s: _setting(self.targets.get(s, s), wire[self.targets.get(s, s)]) for s in changes}
        before = self._info()
        verified(expected, lambda: self._update({k: plain(v) for k, v in wire.items()}), self.current,
                 lambda: self._update({k: before.get(k) for k in wanted}), f"GET {self.url}/key/info")

    def _update(self, limits: dict) -> None:
        answer = self._call("/key/update", "POST", limits)
        if not isinstance(answer, dict):
            raise ActuatorError(f"POST {self.url}/key/update: expected the updated key as a JSON object",
                                unreachable=False)
