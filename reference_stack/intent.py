"""The intent gate: a logistic-regression classifier over query embeddings,
trained at start-up (deterministically, in milliseconds) on the labelled corpus.
probability(query) >= intent_threshold means the query needs tools."""
from __future__ import annotations

import re

import numpy as np

from .corpus import training_examples
from .embedding import DIM, embed


def features(query: str) -> np.ndarray:
    """What the gate looks at: the query's shape, every number alike, no entity weighting."""
    return embed(re.sub(r"\d+", "7", query))


class IntentGate:
    def __init__(self, epochs: int = 600, learning_rate: float = 4.0, l2: float = 1e-3):
        examples = training_examples()
        x = np.stack([features(q) for q, _ in examples]).astype(np.float64)
        y = np.array([label for _, label in examples], dtype=np.float64)
        w, b = np.zeros(DIM), 0.0
        for _ in range(epochs):
            p = 1.0 / (1.0 + np.exp(-(x @ w + b)))
            w -= learning_rate * (x.T @ (p - y) / len(y) + l2 * w)
            b -= learning_rate * float(np.mean(p - y))
        self.w, self.b = w, b

    def probability(self, query: str) -> float:
        """P(the query needs tools)."""
        return float(1.0 / (1.0 + np.exp(-(features(query) @ self.w + self.b))))
