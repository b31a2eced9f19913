"""A circuit breaker per tool: it opens when, over the last `window` calls (at
least `min_calls` of them), the failure ratio exceeds the threshold; after
`cooldown_s` one probe call is let through (half-open), and its success closes it."""
from __future__ import annotations

from collections import deque


class Breaker:
    def __init__(self, window: int = 20, min_calls: int = 5, cooldown_s: float = 5.0):
        self.window, self.min_calls, self.cooldown_s = window, min_calls, cooldown_s
        self.results: deque[bool] = deque(maxlen=window)     # True = failed
        self.opened_at: float | None = None
        self.probing = False

    @property
    def is_open(self) -> bool:
        return self.opened_at is not None

    def allow(self, now: float) -> bool:
        """Whether a call may go out now; a half-open breaker lets exactly one probe through."""
        if self.opened_at is None:
            return True
        if now - self.opened_at >= self.cooldown_s and not self.probing:
            self.probing = True
            return True
        return False

    def record(self, failed: bool, now: float, threshold: float) -> None:
        if self.probing:
            self.probing = False
            if failed:
                self.opened_at = now
            else:
                self.opened_at = None
                self.results.clear()
            return
        self.results.append(failed)
        if (self.opened_at is None and len(self.results) >= self.min_calls
                and sum(self.results) / len(self.results) > threshold):
            self.opened_at = now
