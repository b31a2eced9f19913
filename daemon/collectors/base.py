"""The contract between collectors and the rest of the daemon: what every
collector does each interval, and how it says whether it works."""
from __future__ import annotations

from typing import Iterable, Protocol

from slotune.model.sample import Sample
from slotune.model.service import ServiceSpec


class Collector(Protocol):
    name: str
    # False when the services export these signals themselves (their own /metrics):
    # slotune then does not export them again.
    exports_samples: bool

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

    def parts(self) -> dict[str, bool]:
        """Health of the collector's parts, e.g. each kernel probe: attached or not
        (exported as slotune_probe_attached); {} when it has none."""

    def metric_families(self) -> Iterable:
        """Extra prometheus_client collectors of its own (e.g. per-GPU metrics); () when none."""
