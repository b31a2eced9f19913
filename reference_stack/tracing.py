"""The gateway's trace sampler: a sampled request's spans are written as one
JSON line to the trace log (truncated past max_bytes), the cost that
trace_sample_rate trades against visibility."""
from __future__ import annotations

import json
import random
import uuid
from pathlib import Path


class TraceSampler:
    def __init__(self, path: Path, max_bytes: int = 64 << 20, seed: int | None = None):
        self.path, self.max_bytes = path, max_bytes
        self.rng = random.Random(seed)

    def sample(self, rate: float) -> str | None:
        """A new trace id when this request is sampled at rate (head sampling), else None."""
        return self.new_id() if self.rng.random() < rate else None

    @staticmethod
    def new_id() -> str:
        return uuid.uuid4().hex

    def export(self, trace_id: str, spans: dict) -> None:
        mode = "w" if self.path.exists() and self.path.stat().st_size > self.max_bytes else "a"
        with self.path.open(mode) as f:
            f.write(json.dumps({"trace_id": trace_id, **spans}) + "\n")
