"""Pushes settings as a JSON object over HTTP: the reference stack's
`/admin/config` (GET {"settings": ...}, PATCH {key: value}) and any service
with a similar JSON endpoint. The bearer token is re-read on every call so a
rotated token file takes effect without a restart. Each call has one deadline
and a size cap, follows no redirect and uses no proxy: the token goes only to
the URL the config names, and never into a message."""
from __future__ import annotations

import http.client
import json

from daemon.control.actuators import ActuatorError, numeric_settings, plain
from daemon.control.actuators.safe_files import read_token
from daemon.host.http_exchange import TooLarge, exchange

MAX_ANSWER_BYTES = 1 << 20
DETAIL_CHARS = 200      # of an error answer, quoted in the message


class HttpJsonActuator:
    def __init__(self, url: str, token_file: str = "", method: str = "PATCH",
                 settings_key: str = "", timeout_s: float = 2.0):
        self.url, self.token_file, self.method = url, token_file, method
        self.settings_key, self.timeout_s = settings_key, timeout_s

    def _request(self, method: str, body: dict | None = None):
        headers = {"Content-Type": "application/json"}
        token = read_token(self.token_file) if self.token_file else ""
        if token:
            headers["Authorization"] = "Bearer " + token
        data = json.dumps(body).encode() if body is not None else None
        try:
            status, location, answer = self._exchange(method, data, headers)
        except TimeoutError:
            raise ActuatorError(f"{method} {self.url}: no complete answer within {self.timeout_s:g} s") from None
        except (OSError, http.client.HTTPException, ValueError) as exc:
            raise ActuatorError(f"{method} {self.url}: {_printable(str(exc) or type(exc).__name__, token)}") from None
        if 300 <= status < 400:
            raise ActuatorError(f"{method} {self.url}: HTTP {status}, a redirect to {_printable(location, token)}; "
                                "slotune follows no redirects (the token would go along): "
                                "set url to the address that answers", unreachable=False)
        if status >= 400:
            detail = _printable(answer.decode(errors="replace"), token)[:DETAIL_CHARS]
            raise ActuatorError(f"{method} {self.url}: HTTP {status} {detail}", unreachable=status >= 500)
        try:
            return json.loads(answer or b"{}")
        except ValueError as exc:
            raise ActuatorError(f"{method} {self.url}: the answer is not JSON ({exc})", unreachable=False) from None

    def _exchange(self, method: str, data: bytes | None, headers: dict) -> tuple[int, str, bytes]:
        """(status, Location, body) of one exchange that ends within timeout_s, all of it."""
        try:
            return exchange(self.url, method, data, headers, timeout_s=self.timeout_s, max_bytes=MAX_ANSWER_BYTES)
        except TooLarge:
            raise ActuatorError(f"{method} {self.url}: the answer is larger than {MAX_ANSWER_BYTES} bytes",
                                unreachable=False) from None

    def current(self) -> dict[str, float]:
        reply, where = self._request("GET"), f"GET {self.url}"
        if self.settings_key and isinstance(reply, dict):
            reply, where = reply.get(self.settings_key), f"{where}, member {self.settings_key!r}"
        return numeric_settings(reply, where)

    def push(self, changes: dict[str, float]) -> None:
        self._request(self.method, {k: plain(v) for k, v in changes.items()})


def _printable(text: str, token: str) -> str:
    """Server-sent text fit for a log line: one line, the token (if it echoed it) blanked."""
    if token:
        text = text.replace(token, "<token>")
    return " ".join(text.split())
