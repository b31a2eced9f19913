"""Paced capacity: the inference server's batches timed by a clock, not by a CPU.
A decoder's batch runs one step per token of its longest answer, and a step costs
a fixed part plus a part per sequence in the batch; here that cost is slept, times
1 + a seeded jitter. So a test that offers twice capacity gets twice a known
capacity on any host, busy or quiet, fast or slow (`inference --paced`)."""
from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

SEED = 1


@dataclass
class Pace:
    step_ms: float             # each decoding step's fixed cost
    per_seq_ms: float          # and its cost per sequence in the batch
    jitter: float = 0.0        # a batch's time is scaled by 1 + jitter x N(0, 1), kept within 0.5..1.5
    rng: random.Random = field(default_factory=lambda: random.Random(SEED), repr=False, compare=False)

    @classmethod
    def parse(cls, text: str) -> "Pace":
        """STEP_MS,PER_SEQ_MS[,JITTER]: e.g. "5,0.5,0.05"."""
        try:
            parts = [float(p) for p in text.split(",")]
        except ValueError:
            parts = []
        if len(parts) not in (2, 3) or not all(0 <= p < 1e4 for p in parts) or (len(parts) == 3 and parts[2] > 0.5):
            raise ValueError(f"--paced {text!r}: give STEP_MS,PER_SEQ_MS[,JITTER], each at least 0, JITTER at most 0.5")
        return cls(*parts)

    def batch_s(self, size: int, tokens: int) -> float:
        """Seconds a batch of size sequences takes, its longest answer of tokens tokens, before jitter."""
        return tokens * (self.step_ms + self.per_seq_ms * size) / 1e3

    def capacity(self, size: int, tokens: int) -> float:
        """Answers a second with full batches of size, each answer of tokens tokens, before jitter."""
        return size / self.batch_s(size, tokens)

    def step(self, size: int) -> None:
        """One continuous-batching engine step of size sequences (one token each): sleeps its time."""
        scale = min(max(1.0 + self.jitter * self.rng.gauss(0.0, 1.0), 0.5), 1.5)
        time.sleep((self.step_ms + self.per_seq_ms * size) / 1e3 * scale)

    def run(self, new_tokens: list[int]) -> list[list[int]]:
        """One batch: sleeps its time, answers each sequence its count of (placeholder) tokens."""
        scale = min(max(1.0 + self.jitter * self.rng.gauss(0.0, 1.0), 0.5), 1.5)
        time.sleep(self.batch_s(len(new_tokens), max(new_tokens, default=0)) * scale)
        return [list(range(n)) for n in new_tokens]
