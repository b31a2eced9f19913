"""The one spelling of a series' labels inside slotune: "k=v,k=v", keys sorted,
`le` left out (it is the bucket bound, not a label of the series). A value's
",", "=" and "%" are written %2C, %3D and %25, so that one spelling is one set
of labels: a service's label value ",outcome=rejected" stays a value."""
from __future__ import annotations

_ESCAPES = (("%", "%25"), (",", "%2C"), ("=", "%3D"))     # "%" first: the others' escapes hold one


def key(labels: dict[str, str]) -> str:
    """{"outcome": "ok", "route": "/a"} -> "outcome=ok,route=/a"."""
    return ",".join(f"{k}={_escaped(v)}" for k, v in sorted(labels.items()) if k != "le")


def parse(label: str) -> dict[str, str]:
    """The inverse of key(): "outcome=ok,route=/a" -> {"outcome": "ok", "route": "/a"}."""
    return {k: _unescaped(v) for k, _, v in (part.partition("=") for part in label.split(",") if "=" in part)}


def value(label: str, name: str) -> str | None:
    """One label's value, or None when the series has no such label."""
    return parse(label).get(name)


def _escaped(v: str) -> str:
    if "%" in v or "," in v or "=" in v:
        for raw, escape in _ESCAPES:
            v = v.replace(raw, escape)
    return v


def _unescaped(v: str) -> str:
    if "%" in v:
        for raw, escape in reversed(_ESCAPES):
            v = v.replace(escape, raw)
    return v
