"""The one spelling of a series' labels inside slotune: "k=v,k=v", keys sorted,
`le` left out (it is the bucket bound, not a label of the series)."""
from __future__ import annotations


def key(labels: dict[str, str]) -> str:
    """{"outcome": "ok", "route": "/a"} -> "outcome=ok,route=/a"."""
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()) if k != "le")


def parse(label: str) -> dict[str, str]:
    """The inverse of key(): "outcome=ok,route=/a" -> {"outcome": "ok", "route": "/a"}."""
    return dict(part.split("=", 1) for part in label.split(",") if "=" in part)


def value(label: str, name: str) -> str | None:
    """One label's value, or None when the series has no such label."""
    return parse(label).get(name)
