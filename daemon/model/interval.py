"""One tick of the daemon: each service's windows over the look-back, ending with
the window just built, and their merged spans, computed once and shared by
attribution, the control loop and the baseline recorder."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Mapping

from slotune.model.window import Window, merged_latency, merged_tokens


@dataclass(frozen=True)
class Span:
    """Several consecutive windows of one service taken together."""
    windows: tuple[Window, ...]

    @cached_property
    def latency(self):
        """The windows' request latency merged (see merged_latency), or None."""
        return merged_latency(list(self.windows))

    @cached_property
    def ttft(self):
        """Time to first token over the windows merged, or None (a service that does not stream)."""
        return merged_tokens(list(self.windows), "ttft")

    @cached_property
    def tpot(self):
        """Gaps between output tokens over the windows merged, or None."""
        return merged_tokens(list(self.windows), "tpot")

    @cached_property
    def seconds(self) -> float:
        return sum(w.seconds for w in self.windows)

    @cached_property
    def requests(self) -> int:
        return self.latency.count if self.latency is not None else 0

    @cached_property
    def offered_rps(self) -> float:
        """Requests per second that arrived: answered and refused."""
        offered = sum(w.requests + w.rejected for w in self.windows)
        return offered / self.seconds if self.seconds else 0.0

    def quantile(self, q: float) -> float:
        return self.latency.quantile(q) if self.latency is not None else math.nan

    @cached_property
    def p99(self) -> float:
        return self.quantile(0.99)


@dataclass(frozen=True)
class Interval:
    start: float
    end: float
    history: Mapping[str, tuple[Window, ...]]        # service -> windows, oldest first
    _spans: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def at(cls, end: float, history: Mapping[str, list[Window]]) -> "Interval":
        """An Interval ending at `end` over these windows (tests, benches, replays)."""
        starts = [w.start for ws in history.values() for w in ws[-1:]]
        return cls(min(starts, default=end), end, {k: tuple(v) for k, v in history.items()})

    def windows(self, service: str) -> tuple[Window, ...]:
        return self.history.get(service, ())

    def latest(self, service: str) -> Window | None:
        ws = self.windows(service)
        return ws[-1] if ws else None

    def since(self, service: str, t: float) -> Span:
        """The service's windows that end after t, merged once per tick."""
        key = (service, "end>", t)
        if key not in self._spans:
            self._spans[key] = Span(tuple(w for w in self.windows(service) if w.end > t))
        return self._spans[key]

    def starting(self, service: str, t: float) -> Span:
        """The service's windows that start at or after t (what followed a change made at t)."""
        key = (service, "start>=", t)
        if key not in self._spans:
            self._spans[key] = Span(tuple(w for w in self.windows(service) if w.start >= t))
        return self._spans[key]
