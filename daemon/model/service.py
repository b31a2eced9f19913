"""A service as users declare it: a name, how to find its processes, its SLO,
and (for the control loop) where its settings live."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ServiceSpec:
    name: str
    # Any of these finds the service's processes (all given ones must match).
    systemd_unit: str | None = None
    cgroup: str | None = None            # path under /sys/fs/cgroup
    cmdline: str | None = None           # regular expression over the joined command line
    port: int | None = None              # a TCP port the service listens on
    metrics_url: str = ""                # its own Prometheus /metrics, when it has one
    slo_p99_s: float = 0.5
    # Remote ports that name peers, e.g. {8000: "inference"}; others count as "other".
    peers: dict[int, str] = field(default_factory=dict)

    def __hash__(self) -> int:
        return hash(self.name)
