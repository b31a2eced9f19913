"""Pushes settings as a JSON object over HTTP: the reference stack's
`/admin/config` (GET {"settings": ...}, PATCH {key: value}) and any service
with a similar JSON endpoint. The bearer token is re-read on every call so a
rotated token file takes effect without a restart. Each call has one deadline
and a size cap, follows no redirect and uses no proxy: the token goes only to
the URL the config names, and never into a message."""
from __future__ import annotations

import http.client
import json

from slotune.actuators import ActuatorError, Control, Option, http_url, numeric_settings, plain
from slotune.host.safe_files import read_token
from slotune.host.http_exchange import TooLarge, exchange
from slotune.host.untrusted import Untrusted, json_value

MAX_ANSWER_BYTES = 1 << 20
DETAIL_CHARS = 200      # of an error answer, quoted in the message

KIND = "http-json"
OPTIONS = {"url": Option("an http(s) URL: its settings endpoint", required=True, check=http_url),
           "token_file": Option("a file holding its bearer token"),
           "method": Option("the method that pushes a change", default="PATCH", choices=("PATCH", "POST", "PUT"))}
TARGETS = None


def from_control(control: Control, owns=None) -> "HttpJsonActuator":
    o = control.options
    return HttpJsonActuator(o["url"], o["token_file"], o["method"])


class HttpJsonActuator:
    def __init__(self, url: str, token_file: str = "", method: str = "PATCH",
                 settings_key: str = "", timeout_s: float = 2.0):
        self.url, self.token_file, self.method = url, token_file, method
        self.settings_key, self.timeout_s = settings_key, timeout_s

    def current(self) -> dict[str, float]:
        reply, where = call_json(self.url, "GET", None, self.token_file, self.timeout_s), f"GET {self.url}"
        if self.settings_key and isinstance(reply, dict):
            reply, where = reply.get(self.settings_key), f"{where}, member {self.settings_key!r}"
        return numeric_settings(reply, where)

    def push(self, changes: dict[str, float]) -> None:
        call_json(self.url, self.method, {k: plain(v) for k, v in changes.items()}, self.token_file, self.timeout_s)


def call_json(url: str, method: str, body: object | None, token_file: str = "", timeout_s: float = 2.0):
    """The JSON answer to one request with a JSON body (or none); an empty answer is {}.
    An answer that is not JSON, or nests too deep, is a refusal (ActuatorError)."""
    data = json.dumps(body).encode() if body is not None else None
    answer = call(url, method, data, token_file, timeout_s)
    try:
        return json_value(answer or b"{}", f"{method} {url}: the answer", MAX_ANSWER_BYTES)
    except Untrusted as exc:
        raise ActuatorError(str(exc), unreachable=False) from None


def call(url: str, method: str, data: bytes | None, token_file: str = "", timeout_s: float = 2.0) -> bytes:
    """The body of a 2xx answer to one request; ActuatorError for anything else (unreachable
    when the service did not answer or answered 5xx, a refusal for a redirect or a 4xx)."""
    headers = {"Content-Type": "application/json"}
    token = read_token(token_file) if token_file else ""
    if token:
        headers["Authorization"] = "Bearer " + token
    try:
        status, location, answer = exchange(url, method, data, headers, timeout_s=timeout_s,
                                            max_bytes=MAX_ANSWER_BYTES)
    except TooLarge:
        raise ActuatorError(f"{method} {url}: the answer is larger than {MAX_ANSWER_BYTES} bytes",
                            unreachable=False) from None
    except TimeoutError:
        raise ActuatorError(f"{method} {url}: no complete answer within {timeout_s:g} s") from None
    except (OSError, http.client.HTTPException, ValueError) as exc:
        raise ActuatorError(f"{method} {url}: {_printable(str(exc) or type(exc).__name__, token)}") from None
    if 300 <= status < 400:
        raise ActuatorError(f"{method} {url}: HTTP {status}, a redirect to {_printable(location, token)}; "
                            "slotune follows no redirects (the token would go along): "
                            "set url to the address that answers", unreachable=False)
    if status >= 400:
        detail = _printable(answer.decode(errors="replace"), token)[:DETAIL_CHARS]
        raise ActuatorError(f"{method} {url}: HTTP {status} {detail}", unreachable=status >= 500)
    return answer


def _printable(text: str, token: str) -> str:
    """Server-sent text fit for a log line: one line, the token (if it echoed it) blanked."""
    if token:
        text = text.replace(token, "<token>")
    return " ".join(text.split())
