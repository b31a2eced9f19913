"""A kernel histogram's slots as OpenTelemetry exponential-histogram buckets: base 2 at
SCALE (bucket i holds (2^(i/16), 2^((i+1)/16)] seconds), each slot's count spread evenly
over its width, as histogram_quantile reads a bucket. Pure arithmetic."""
from __future__ import annotations

import math

import numpy as np

from slotune.model.histogram import LOWS, SUB_BITS, WIDTHS, Histogram

# Twice as many buckets per power of two as the kernel has slots, so that spreading a slot
# over them costs no precision (at SUB_BITS the spreading adds an error of its own): a P99
# read back from them is as close as one read from the slots (tests/export/test_p99_read_back.py).
SCALE = SUB_BITS + 1


def exponential_buckets(h: Histogram) -> tuple[int, int, list[int]]:
    """(zero_count, offset, counts): h's observations of 0 ns, and the others in the buckets
    from offset on (counts[k] in bucket offset + k), none empty at either end."""
    zero = int(h.kept[0]) if h.lo == 0 and len(h.kept) else 0
    rest = Histogram(h.kept[1:], 0.0, 1) if h.lo == 0 else h
    if not len(rest.kept):
        return zero, 0, []
    edges = np.r_[LOWS[rest.lo:rest.hi], LOWS[rest.hi - 1] + WIDTHS[rest.hi - 1]] / 1e9
    below = np.r_[0, np.cumsum(rest.kept)]          # observations below each slot edge
    per_octave = 1 << SCALE
    # one bucket of margin each side, so rounding cannot leave an observation out
    first = math.floor(math.log2(edges[0]) * per_octave) - 1
    last = math.ceil(math.log2(edges[-1]) * per_octave) + 1
    bounds = np.exp2(np.arange(first, last + 1) / per_octave)
    counts = np.diff(np.rint(np.interp(bounds, edges, below)).astype(np.int64))
    filled = np.flatnonzero(counts)
    return zero, first + int(filled[0]), counts[filled[0]:filled[-1] + 1].tolist()
