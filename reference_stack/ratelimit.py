"""The gateway's admission control: a token bucket at rate_limit_rps (0 means
unlimited) holding a quarter second's worth of tokens, at least one."""
from __future__ import annotations


class TokenBucket:
    def __init__(self):
        self.tokens = 1.0
        self.last: float | None = None

    def admit(self, rate: float, now: float) -> bool:
        if rate <= 0:
            return True
        capacity = max(1.0, rate / 4.0)
        if self.last is not None:
            self.tokens = min(capacity, self.tokens + (now - self.last) * rate)
        self.last = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False
