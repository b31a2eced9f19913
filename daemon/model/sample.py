"""What one collector saw of one service during one interval: the unit every
collector hands to the daemon, before it is merged into a Window."""
from __future__ import annotations

from dataclasses import dataclass, field

from slotune.model.histogram import BucketHistogram, Histogram

# A signal key: (signal name, one bounded label value or ""), e.g.
# ("runqueue_wait", ""), ("offcpu", "futex"), ("tcp_rtt", "inference"), ("http_request", "").
Key = tuple[str, str]


@dataclass
class Sample:
    """Histograms and counters are deltas over [start, end), gauges are last values."""
    service: str
    collector: str
    start: float
    end: float
    histograms: dict[Key, Histogram | BucketHistogram] = field(default_factory=dict)
    counters: dict[Key, float] = field(default_factory=dict)
    gauges: dict[Key, float] = field(default_factory=dict)
