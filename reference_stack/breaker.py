"""A circuit breaker per tool: it opens when, over the last `window` calls (at
least `min_calls` of them), the failure ratio exceeds the threshold, or after
`consecutive` failures in a row (0 = off); after `open_s` one probe call is let
through (half-open), and its success closes it. Thresholds come in per call,
so the gateway's settings apply at once."""
from __future__ import annotations

from collections import deque


class Breaker:
    def __init__(self, window: int = 20, min_calls: int = 5):
        self.window, self.min_calls = window, min_calls
        self.results: deque[bool] = deque(maxlen=window)     # True = failed
        self.streak = 0                                       # failures in a row
        self.opened_at: float | None = None
        self.probing = False

    @property
    def is_open(self) -> bool:
        return self.opened_at is not None

    def allow(self, now: float, open_s: float) -> bool:
        """Whether a call may go out now; a half-open breaker lets exactly one probe through."""
        if self.opened_at is None:
            return True
        if now - self.opened_at >= open_s and not self.probing:
            self.probing = True
            return True
        return False

    def record(self, failed: bool, now: float, threshold: float, consecutive: int = 0) -> None:
        self.streak = self.streak + 1 if failed else 0
        if self.probing:
            self.probing = False
            if failed:
                self.opened_at = now
            else:
                self.opened_at = None
                self.results.clear()
            return
        self.results.append(failed)
        by_ratio = len(self.results) >= self.min_calls and sum(self.results) / len(self.results) > threshold
        by_run = consecutive > 0 and self.streak >= consecutive
        if self.opened_at is None and (by_ratio or by_run):
            self.opened_at = now
