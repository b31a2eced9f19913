"""Pushes settings as a JSON object over HTTP: the reference stack's
`/admin/config` (GET {"settings": ...}, PATCH {key: value}) and any service
with a similar JSON endpoint. The bearer token is re-read on every call so a
rotated token file takes effect without a restart."""
from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

from daemon.control.actuators import ActuatorError


class HttpJsonActuator:
    def __init__(self, url: str, token_file: str = "", method: str = "PATCH",
                 settings_key: str = "", timeout_s: float = 2.0):
        self.url, self.token_file, self.method = url, token_file, method
        self.settings_key, self.timeout_s = settings_key, timeout_s

    def _request(self, method: str, body: dict | None = None) -> dict:
        headers = {"Content-Type": "application/json"}
        if self.token_file:
            try:
                headers["Authorization"] = "Bearer " + Path(self.token_file).read_text().strip()
            except OSError as exc:
                raise ActuatorError(f"cannot read token file {self.token_file}: {exc.strerror}") from None
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:200]
            raise ActuatorError(f"{method} {self.url}: HTTP {exc.code} {detail}", unreachable=exc.code >= 500) from None
        except (OSError, ValueError) as exc:
            raise ActuatorError(f"{method} {self.url}: {exc}") from None

    def current(self) -> dict[str, float]:
        reply = self._request("GET")
        settings = reply.get(self.settings_key, {}) if self.settings_key else reply
        return {k: float(v) for k, v in settings.items() if isinstance(v, (int, float))}

    def push(self, changes: dict[str, float]) -> None:
        self._request(self.method, {k: _plain(v) for k, v in changes.items()})


def _plain(value: float) -> float | int:
    """Whole numbers go out as JSON integers (batch sizes, limits)."""
    return int(value) if float(value).is_integer() else value
