"""What a watched service sends is hostile until read: JSON within a size cap and
a nesting depth, one exception type out (Untrusted, a ValueError), whatever the
input; callers turn it into their own error (an ActuatorError, a failed scrape).
And its text is inert where a person reads it: in the log (InertFormatter) and
in `slotune status`, every character a terminal would act on shows as its escape."""
from __future__ import annotations

import json
import logging
import re
from itertools import accumulate

MAX_JSON_BYTES = 1 << 20
MAX_DEPTH = 64                  # settings and API answers nest a few levels; 64 is far beyond any
# a string, closed or not (an unclosed one runs to the end): each byte is looked at once, never again
_STRINGS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"?', re.S)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = [0] * 256               # what each bracket does to the nesting
_STEP[ord("[")] = _STEP[ord("{")] = 1
_STEP[ord("]")] = _STEP[ord("}")] = -1


class Untrusted(ValueError):
    """A service's answer that cannot be read within its budget, or at all."""


def json_value(data: bytes | str, where: str, max_bytes: int = MAX_JSON_BYTES, max_depth: int = MAX_DEPTH):
    """The JSON value in data; Untrusted when it is larger than max_bytes, nests deeper than
    max_depth, or is not JSON (never RecursionError, MemoryError or OverflowError). where
    names data in the message: "settings file /etc/x.json" is not JSON (...)."""
    raw = data.encode(errors="surrogatepass") if isinstance(data, str) else bytes(data)
    if len(raw) > max_bytes:
        raise Untrusted(f"{where} is {len(raw)} bytes, more than the {max_bytes} read")
    if depth(raw) > max_depth:
        raise Untrusted(f"{where} is nested deeper than {max_depth} levels")
    try:
        return json.loads(raw)
    except (ValueError, RecursionError, MemoryError, OverflowError) as exc:
        raise Untrusted(f"{where} is not JSON ({_short(exc)})") from None


def depth(raw: bytes) -> int:
    """The deepest nesting of [ and { outside strings, in linear time (the loops run in C).
    Brackets after a stray ] may be undercounted, but JSON stops reading at that ] anyway."""
    brackets = _STRINGS.sub(b"", raw).translate(None, _NOT_BRACKETS)
    return max(accumulate(map(_STEP.__getitem__, brackets), initial=0))


def _short(exc: BaseException) -> str:
    return (str(exc) or type(exc).__name__)[:120]


def inert(text: str) -> str:
    """text with each character a terminal or a log reader would act on or hide (ESC, CSI,
    BEL, newlines and the other C0 and C1 controls, line separators, bidi overrides) shown
    as its escape (\\x1b): one line, as written, whatever a service put in it."""
    return text if text.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class InertFormatter(logging.Formatter):
    """Log lines whose message is inert: a service's error body, quoted in a message, can
    neither forge a line of its own nor send escapes to whoever reads the journal.
    Tracebacks keep their lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return inert(super().formatMessage(record))
