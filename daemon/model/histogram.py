"""Latency histograms as the BPF programs keep them: log2 buckets split into
SUB linear sub-buckets (about 9 % wide), in nanoseconds. Pure arithmetic:
quantiles, deltas between two reads, and the coarse bounds Prometheus gets.
The arithmetic never raises, whatever the counts: a service's histogram whose
counts add up to no finite number counts nothing."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np

SUB_BITS = 3
SUB = 1 << SUB_BITS          # sub-buckets per power of two
OCTAVES = 40                 # 1 ns .. ~18 min
SLOTS = OCTAVES * SUB


def slot_of(value_ns: int) -> int:
    """Bucket index for a value; the same arithmetic as bpf/common.h slot_of()."""
    if value_ns < SUB:
        return max(int(value_ns), 0)
    octave = int(value_ns).bit_length() - 1
    sub = (int(value_ns) >> (octave - SUB_BITS)) & (SUB - 1)
    return min((octave - SUB_BITS + 1) * SUB + sub, SLOTS - 1)


def slot_bounds(slot: int) -> tuple[float, float]:
    """[low, high) of a bucket, in ns."""
    if slot < SUB:
        return float(slot), float(slot + 1)
    octave = slot // SUB + SUB_BITS - 1
    sub = slot % SUB
    width = 1 << (octave - SUB_BITS)
    low = (1 << octave) + sub * width
    return float(low), float(low + width)


LOWS = np.array([slot_bounds(s)[0] for s in range(SLOTS)])                # each bucket's low edge, ns
WIDTHS = np.array([slot_bounds(s)[1] - slot_bounds(s)[0] for s in range(SLOTS)])


class Histogram:
    """Counts per slot (ns). `total_ns` is the exact sum where the source keeps one.
    Only the slots from the first counted one to the last are kept (`kept`, from slot
    `lo`): a window's delta counts a few dozen of the 320, and the daemon keeps
    thousands of them in its history. `counts` gives all 320."""
    __slots__ = ("lo", "kept", "total_ns")

    def __init__(self, counts=None, total_ns: float = 0.0, lo: int = 0):
        """From counts per slot, slot `lo` first (all slots from 0 by default)."""
        counts = np.zeros(0, dtype=np.int64) if counts is None else np.asarray(counts, dtype=np.int64)
        filled = np.flatnonzero(counts)
        self.lo = lo + int(filled[0]) if len(filled) else 0
        self.kept = counts[filled[0]:filled[-1] + 1].copy() if len(filled) else counts[:0].copy()
        self.total_ns = total_ns

    @classmethod
    def from_values(cls, values_ns) -> "Histogram":
        counts = np.zeros(SLOTS, dtype=np.int64)
        total = 0.0
        for v in values_ns:
            counts[slot_of(int(v))] += 1
            total += float(v)
        return cls(counts, total)

    @property
    def counts(self) -> np.ndarray:
        """All SLOTS counts (a new array)."""
        out = np.zeros(SLOTS, dtype=np.int64)
        out[self.lo:self.lo + len(self.kept)] = self.kept
        return out

    @property
    def hi(self) -> int:
        """One past the last slot kept."""
        return self.lo + len(self.kept)

    @property
    def count(self) -> int:
        return int(self.kept.sum())

    def _over(self, lo: int, hi: int) -> np.ndarray:
        """Counts of slots lo..hi-1, which hold all this one's."""
        out = np.zeros(hi - lo, dtype=np.int64)
        out[self.lo - lo:self.hi - lo] = self.kept
        return out

    def _span(self, other: "Histogram") -> tuple[int, int]:
        """The slots that hold both's counts."""
        if not len(other.kept):
            return self.lo, self.hi
        if not len(self.kept):
            return other.lo, other.hi
        return min(self.lo, other.lo), max(self.hi, other.hi)

    def minus(self, earlier: "Histogram") -> "Histogram":
        """What arrived between two cumulative reads (a reset reads as a fresh start)."""
        lo, hi = self._span(earlier)
        delta = self._over(lo, hi) - earlier._over(lo, hi)
        if (delta < 0).any():
            return Histogram(self.kept, self.total_ns, self.lo)
        return Histogram(delta, self.total_ns - earlier.total_ns, lo)

    def plus(self, other: "Histogram") -> "Histogram":
        """Both together. The attribution horizon sums hundreds a call: no trim is needed
        (each end is one's counted end), and one that is empty gives the other's counts
        (never changed in place, so shared)."""
        a, b = self, other
        if not len(b.kept) or not len(a.kept):
            lo, kept = (a.lo, a.kept) if len(a.kept) else (b.lo, b.kept)
        elif a.lo == b.lo and len(a.kept) == len(b.kept):
            lo, kept = a.lo, a.kept + b.kept
        else:
            lo, hi = a._span(b)
            kept = a._over(lo, hi)
            kept[b.lo - lo:b.hi - lo] += b.kept
        out = Histogram.__new__(Histogram)
        out.lo, out.kept, out.total_ns = lo, kept, a.total_ns + b.total_ns
        return out

    def quantile(self, q: float) -> float:
        """q-quantile in seconds, NaN when empty; never outside the non-empty buckets.
        Linear inside the bucket the rank falls in, over the part of it where the
        exact sum says the observations sit (see occupied()): 5 ms sleeps, 5.05 to
        5.2 ms each in the bucket 4.72 to 5.24 ms, read 5.1 ms at P50 where the
        bucket's middle would say 4.98 ms."""
        return self.quantiles((q,))[0]

    def quantiles(self, qs: tuple[float, ...]) -> list[float]:
        """quantile() of each q, the buckets summed once for all."""
        n = self.count
        if n == 0:
            return [float("nan")] * len(qs)
        kept, lo = self.kept, self.lo            # kept's first and last slots are counted ones
        cumulative = np.cumsum(kept)
        start, end = self.occupied()
        out = []
        for q in qs:
            rank = min(max(q, 0.0), 1.0) * n
            i = min(int(np.searchsorted(cumulative, rank, side="left")), len(kept) - 1)   # kept[i] > 0
            before = cumulative[i - 1] if i else 0
            frac = min(max((rank - before) / kept[i], 0.0), 1.0)
            out.append((LOWS[lo + i] + WIDTHS[lo + i] * (start + (end - start) * frac)) / 1e9)
        return out

    def occupied(self) -> tuple[float, float]:
        """The part [start, end] of every bucket (0 its low edge, 1 its high one)
        that holds the observations, the same for all buckets: the widest one whose
        middle is their mean position inside their buckets, which the exact sum
        gives. The whole bucket where there is no sum that fits the buckets (a
        source that keeps none). The estimate never leaves the rank's bucket."""
        span = float((self.kept * WIDTHS[self.lo:self.hi]).sum())
        position = (self.total_ns - float((self.kept * LOWS[self.lo:self.hi]).sum())) / span if span else 0.5
        if not 0.0 <= position <= 1.0:
            return 0.0, 1.0
        return (2 * position - 1, 1.0) if position >= 0.5 else (0.0, 2 * position)

    def mean(self) -> float:
        n = self.count
        return self.total_ns / n / 1e9 if n else float("nan")

    def fraction_above(self, threshold_s: float) -> float:
        """Share of observations slower than threshold (interpolated inside its bucket)."""
        n = self.count
        if n == 0:
            return 0.0
        t = threshold_s * 1e9
        slot = slot_of(int(t))
        low, high = slot_bounds(slot)
        i = min(max(slot - self.lo, 0), len(self.kept))
        inside = self.kept[i] if self.lo <= slot < self.hi else 0
        below = self.kept[:i].sum() + inside * (t - low) / (high - low)
        return max(0.0, 1.0 - below / n)

    def prometheus_buckets(self, bounds_s: tuple[float, ...]) -> list[tuple[str, int]]:
        """Cumulative (le, count) pairs for the given upper bounds in seconds, +Inf last.
        Bounds should sit on slot edges (export_bounds()) so no bucket straddles one."""
        cumulative = np.cumsum(self.kept)
        out = []
        for le in bounds_s:
            last = min(slot_of(round(le * 1e9)) - 1, self.hi - 1) - self.lo    # in kept (round: 1.92e-06 * 1e9 < 1920)
            out.append((repr(float(le)), int(cumulative[last]) if last >= 0 else 0))
        out.append(("+Inf", self.count))
        return out


BUCKETS_PER_OCTAVE = (1, 2, 4, 8)   # what [export] buckets_per_octave allows; SUB is a multiple of each


def export_bounds(per_octave: int = SUB) -> tuple[float, ...]:
    """The bucket bounds every slotune latency metric exports, in seconds: from 2^10 ns
    (~1 µs) to ~69 s, per_octave linear steps in each power of two, each on a slot's edge
    (so no bucket straddles one); by default every slot's edge (208 buckets). Read back with
    PromQL's histogram_quantile, a P50 or P99 is within 1.73x of the exact one at 1 step
    (26 buckets), 1.33x at 2, 1.13x at 4, 1.09x at 8 (lognormal samples, tests/test_histogram.py;
    the P99 alone, by shape: tests/export/test_p99_read_back.py)."""
    if per_octave not in BUCKETS_PER_OCTAVE:
        raise ValueError(f"buckets per octave must be one of {BUCKETS_PER_OCTAVE}, not {per_octave!r}")
    return tuple(((1 << k) + j * ((1 << k) // per_octave)) / 1e9 for k in range(10, 36) for j in range(per_octave))


@dataclass
class BucketHistogram:
    """A Prometheus histogram as a service exports it: upper bounds in seconds
    (+Inf last) and per-bucket (not cumulative) counts. Quantiles interpolate
    linearly inside a bucket, as PromQL's histogram_quantile does. Counts that add
    up to no finite number (infinite, NaN) count nothing: no quantile, no mean."""
    bounds_s: tuple[float, ...]
    counts: np.ndarray
    total_s: float = 0.0

    @classmethod
    def from_cumulative(cls, pairs: list[tuple[float, float]], total_s: float) -> "BucketHistogram":
        bounds, cumulative = zip(*sorted(pairs))
        return cls(bounds, np.subtract(cumulative, (0.0, *cumulative[:-1]), dtype=np.float64), total_s)

    @property
    def count(self) -> int:
        return round(self._observations())

    def _observations(self) -> float:
        """The counts' sum; 0 where it is not a finite number."""
        n = float(self.counts.sum())
        return n if math.isfinite(n) else 0.0

    def minus(self, earlier: "BucketHistogram") -> "BucketHistogram":
        if earlier.bounds_s != self.bounds_s or (self.counts < earlier.counts).any():
            return BucketHistogram(self.bounds_s, self.counts.copy(), self.total_s)
        return BucketHistogram(self.bounds_s, self.counts - earlier.counts, self.total_s - earlier.total_s)

    def plus(self, other: "BucketHistogram") -> "BucketHistogram":
        """Both together, on this one's bounds (a service that changed its buckets, say on a
        new version, has its other counts spread onto these as histogram_quantile would)."""
        if other.bounds_s != self.bounds_s:
            other = other.rebinned(self.bounds_s)
        return BucketHistogram(self.bounds_s, self.counts + other.counts, self.total_s + other.total_s)

    def rebinned(self, bounds_s: tuple[float, ...]) -> "BucketHistogram":
        """The same observations counted in other buckets: linear inside each of ours, all
        of the +Inf bucket above the highest finite bound."""
        n = self._observations()
        below = [n * (1.0 - self.fraction_above(b)) if not np.isinf(b) else n for b in bounds_s]
        return BucketHistogram(tuple(bounds_s), np.diff(np.array(below, dtype=np.float64), prepend=0.0),
                               self.total_s)

    def quantile(self, q: float) -> float:
        return self.quantiles((q,))[0]

    def quantiles(self, qs: tuple[float, ...]) -> list[float]:
        """quantile() of each q, the buckets summed once for all."""
        n = self._observations()
        if n <= 0:
            return [float("nan")] * len(qs)
        cumulative = np.cumsum(self.counts)
        return [self._at(q * n, cumulative) for q in qs]

    def _at(self, rank: float, cumulative: np.ndarray) -> float:
        i = min(int(np.searchsorted(cumulative, rank, side="left")), len(self.bounds_s) - 1)
        if np.isinf(self.bounds_s[i]):  # as PromQL: the highest finite bound
            return self.bounds_s[i - 1] if i else float("nan")
        low = self.bounds_s[i - 1] if i else 0.0
        before = cumulative[i - 1] if i else 0.0
        inside = self.counts[i]
        frac = (rank - before) / inside if inside else 0.0
        return low + (self.bounds_s[i] - low) * min(max(frac, 0.0), 1.0)

    def mean(self) -> float:
        n = self._observations()
        return self.total_s / n if n else float("nan")

    def fraction_above(self, threshold_s: float) -> float:
        """Share of observations slower than threshold (interpolated inside the bucket)."""
        n = self._observations()
        if n <= 0:
            return 0.0
        below, low = 0.0, 0.0
        for bound, c in zip(self.bounds_s, self.counts):
            if bound <= threshold_s:
                below += c
            elif not np.isinf(bound) and low < threshold_s:
                below += c * (threshold_s - low) / (bound - low)
            low = bound
        return max(0.0, 1.0 - below / n)


def merged(parts: Iterable[Histogram | BucketHistogram]) -> Histogram | BucketHistogram | None:
    """Histograms of one kind added together (their series, windows or labels summed away);
    None when there are none."""
    out: Any = None     # a Histogram's plus takes a Histogram, a BucketHistogram's a BucketHistogram
    for h in parts:
        out = h if out is None else out.plus(h)
    return out


def add_into(into: dict, key, h: Histogram | BucketHistogram) -> None:
    """into[key] plus h, or h where key is new: histograms kept by key, merged as they come."""
    into[key] = into[key].plus(h) if key in into else h
