"""The contract between collectors and the rest of the daemon."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from daemon.model.histogram import Histogram
from daemon.model.service import ServiceSpec

# A signal key: (signal name, one bounded label value or ""), e.g.
# ("runqueue_wait", ""), ("offcpu", "futex"), ("tcp_rtt", "inference"), ("http_request", "").
Key = tuple[str, str]


@dataclass
class Sample:
    """What one collector saw of one service during one interval [start, end).
    Histograms and counters are deltas over the interval, gauges are last values."""
    service: str
    collector: str
    start: float
    end: float
    histograms: dict[Key, Histogram] = field(default_factory=dict)
    counters: dict[Key, float] = field(default_factory=dict)
    gauges: dict[Key, float] = field(default_factory=dict)


class Collector(Protocol):
    name: str

    def start(self, services: list[ServiceSpec]) -> None:
        """Attach / open; report what cannot work once, clearly, and carry on."""

    def update_services(self, services: list[ServiceSpec]) -> None:
        """The service list changed (config reload)."""

    def collect(self, start: float, end: float) -> list[Sample]:
        """One Sample per service for the interval just ended."""

    def close(self) -> None:
        """Detach everything; safe to call twice."""

    @property
    def up(self) -> bool:
        """False when the collector could not start at all (exported as slotune_collector_up)."""
