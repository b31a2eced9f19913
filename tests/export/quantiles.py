"""Quantiles read from exported buckets the way their readers compute them: PromQL's
histogram_quantile over classic buckets, and the same over OTLP exponential buckets."""
import math

import numpy as np


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """PromQL's histogram_quantile over (le, cumulative count) pairs, +Inf among them
    (promql/quantile.go bucketQuantile): linear inside the bucket the rank falls in."""
    buckets = sorted(buckets)
    rank = q * buckets[-1][1]
    b = next(i for i, (_, c) in enumerate(buckets[:-1] + [(math.inf, math.inf)]) if c >= rank)
    if b == len(buckets) - 1:
        return buckets[-2][0]
    start, before = buckets[b - 1] if b else (0.0, 0.0)
    return start + (buckets[b][0] - start) * (rank - before) / (buckets[b][1] - before)


def exponential_quantile(q: float, scale: int, zero: int, offset: int, counts) -> float:
    """The same over OTLP exponential buckets (bucket offset + k holds (base^(offset+k),
    base^(offset+k+1)], base = 2^(2^-scale)), the zero bucket first; in their unit."""
    base = 2 ** (2 ** -scale)
    buckets = [(0.0, zero)] + [(base ** (offset + k + 1), zero + c) for k, c in enumerate(np.cumsum(counts))]
    return histogram_quantile(q, buckets + [(math.inf, buckets[-1][1])])
