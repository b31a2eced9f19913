"""The histogram arithmetic every latency signal goes through, and that it never
raises, whatever numbers a service put in its counts."""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from slotune.model.histogram import (BUCKETS_PER_OCTAVE, SLOTS, BucketHistogram, Histogram, export_bounds,
                                    slot_bounds, slot_of)


def test_every_value_falls_inside_its_bucket():
    rng = np.random.default_rng(1)
    for v in rng.integers(0, 1 << 36, 20000):
        low, high = slot_bounds(slot_of(int(v)))
        assert low <= v < high


def test_quantiles_are_within_five_percent_on_a_lognormal():
    rng = np.random.default_rng(2)
    values = rng.lognormal(np.log(5e6), 0.4, 20000)
    h = Histogram.from_values(values)
    for q in (0.5, 0.9, 0.99):
        assert abs(h.quantile(q) * 1e9 / np.quantile(values, q) - 1) < 0.05


def test_delta_between_reads_and_counter_reset():
    first = Histogram.from_values([1000, 2000])
    later = first.plus(Histogram.from_values([4000]))
    assert later.minus(first).count == 1 and later.minus(first).total_ns == 4000
    assert first.minus(later).count == 2  # counts went down: the map was reset


def test_only_the_counted_span_is_kept_and_the_arithmetic_is_that_of_all_slots():
    """A window's delta keeps the slots from its first counted one to its last; sums,
    deltas, cumulative buckets and shares above a threshold are what numpy gives on
    all 320 slots, for histograms apart, overlapping, nested and empty."""
    rng = np.random.default_rng(3)
    spans = [(40, 60), (100, 140), (50, 120), (0, 320), (300, 320), (70, 71), (0, 0)]
    for (a_lo, a_hi), (b_lo, b_hi) in [(x, y) for x in spans for y in spans]:
        dense_a, dense_b = np.zeros(SLOTS, np.int64), np.zeros(SLOTS, np.int64)
        dense_a[a_lo:a_hi] = rng.integers(0, 5, a_hi - a_lo)
        dense_b[b_lo:b_hi] = rng.integers(0, 5, b_hi - b_lo)
        a, b = Histogram(dense_a, 1e6), Histogram(dense_b, 2e6)
        filled = np.flatnonzero(dense_a)
        assert len(a.kept) == (filled[-1] - filled[0] + 1 if len(filled) else 0)
        assert np.array_equal(a.counts, dense_a) and a.count == dense_a.sum()
        assert np.array_equal(a.plus(b).counts, dense_a + dense_b)
        assert np.array_equal(a.plus(b).minus(b).counts, dense_a)
        if (dense_a - dense_b < 0).any():        # a reset: the later read as it is
            assert np.array_equal(a.minus(b).counts, dense_a)
        cumulative = np.cumsum(dense_a)
        for per_octave in BUCKETS_PER_OCTAVE:
            for le, n in a.prometheus_buckets(export_bounds(per_octave))[:-1]:
                assert n == cumulative[slot_of(round(float(le) * 1e9)) - 1]
        for t_s in (1e-7, 2e-6, 3.3e-5, 1e-3, 20.0):
            slot = slot_of(int(t_s * 1e9))
            low, high = slot_bounds(slot)
            below = dense_a[:slot].sum() + dense_a[slot] * (t_s * 1e9 - low) / (high - low)
            assert a.fraction_above(t_s) == pytest.approx(max(0.0, 1 - below / dense_a.sum()) if dense_a.sum() else 0.0)


def test_prometheus_buckets_are_cumulative_and_end_with_inf():
    h = Histogram.from_values([1500, 3000, 3000, 5e9])
    buckets = h.prometheus_buckets(export_bounds())
    counts = [c for _, c in buckets]
    assert counts == sorted(counts) and buckets[-1] == ("+Inf", 4)
    assert dict(buckets)[repr(2048 / 1e9)] == 1  # 1500 ns only


def test_exported_bounds_sit_on_slot_edges_and_read_back_within_their_stated_error():
    # histogram_quantile over the exported buckets (BucketHistogram interpolates as PromQL does)
    # against the exact P50 and P99 of lognormal samples from 50 us to 5 s: the worst ratio of
    # each step count, as export_bounds() states it (1 step: the 1.7x issue 40 measured)
    rng = np.random.default_rng(1)
    samples = [rng.lognormal(np.log(m * 1e6), sigma, 2000) for m in np.geomspace(0.05, 5000, 40)
               for sigma in (0.1, 0.3, 0.5, 1.0)]
    for per_octave, stated in ((1, 1.73), (2, 1.33), (4, 1.13), (8, 1.09)):
        bounds = export_bounds(per_octave)
        assert len(bounds) == 26 * per_octave
        assert all(slot_bounds(slot_of(round(b * 1e9)))[0] == round(b * 1e9) for b in bounds)   # on an edge
        worst = 1.0
        for values in samples:
            h = Histogram.from_values(values)
            pairs = [(float(le), n) for le, n in h.prometheus_buckets(bounds)]
            read = BucketHistogram.from_cumulative(pairs, h.total_ns / 1e9)
            for q in (0.5, 0.99):
                exact = float(np.quantile(values, q)) / 1e9
                worst = max(worst, read.quantile(q) / exact, exact / read.quantile(q))
        assert stated - 0.05 < worst <= stated, (per_octave, worst)
    with pytest.raises(ValueError, match="one of"):
        export_bounds(3)


def test_empty_histogram_has_no_quantile():
    assert np.isnan(Histogram().quantile(0.99))


def test_bucket_histograms_with_other_bounds_add_up_on_the_first_ones():
    # A service restarted with new buckets: its windows still merge (they used to raise).
    old = BucketHistogram.from_cumulative([(0.1, 10), (0.5, 30), (math.inf, 40)], 8.0)
    new = BucketHistogram.from_cumulative([(0.05, 5), (0.1, 10), (1.0, 30), (math.inf, 40)], 9.0)
    both = old.plus(new)
    assert both.bounds_s == old.bounds_s and both.count == 80 and both.total_s == 17.0
    assert list(both.counts) == pytest.approx([20, 20 + 20 * 0.4 / 0.9, 10 + 10 + 20 * 0.5 / 0.9])
    assert new.plus(old).bounds_s == new.bounds_s


def test_quantiles_stay_inside_the_filled_buckets_and_follow_the_exact_sum():
    sleeps = Histogram.from_values([5.05e6, 5.08e6, 5.1e6, 5.2e6])      # one bucket, 4.72 to 5.24 ms
    low, high = slot_bounds(slot_of(5.05e6))
    assert low / 1e9 <= sleeps.quantile(0.0) and sleeps.quantile(1.0) <= high / 1e9
    assert sleeps.quantile(0.5) == pytest.approx(sleeps.mean())         # the bucket's middle is 4.98 ms
    spread = Histogram.from_values([3000, 5e6, 7e8])
    assert spread.quantile(0.0) * 1e9 >= slot_bounds(slot_of(3000))[0]  # was 0: the empty first bucket
    assert spread.quantile(1.5) * 1e9 <= slot_bounds(slot_of(7e8))[1]
    no_sum = Histogram(sleeps.counts.copy())                            # a source that keeps no sum
    assert no_sum.quantile(0.5) * 1e9 == pytest.approx((low + high) / 2)


QUIET = pytest.mark.filterwarnings("ignore::RuntimeWarning")     # numpy's word on inf - inf; it does not raise


@QUIET
def test_counts_that_add_up_past_a_floats_range_count_nothing():
    # Two reads of 1.5e308 each merge to inf counts: int(round(inf)) raised OverflowError.
    huge = BucketHistogram.from_cumulative([(0.1, 1.5e308), (math.inf, 1.5e308)], 1.0)
    for h in (huge.plus(huge), BucketHistogram((0.1, math.inf), np.array([math.nan, 1.0]), 1.0)):
        assert h.count == 0 and math.isnan(h.mean()) and h.fraction_above(0.05) == 0.0
        assert all(math.isnan(q) for q in h.quantiles((0.5, 0.99)))
        assert h.rebinned((0.2, math.inf)).count == 0
    assert huge.count == round(1.5e308)


ANY_NUMBER = st.floats() | st.sampled_from([1.5e308, -1.5e308, 2.0 ** 53, 5e-324, 0.0, math.inf, math.nan])


@st.composite
def two_bucket_histograms(draw):
    """Two histograms of up to 5 buckets, of any numbers (the bounds sorted or not), the
    second on the first's bounds or on its own."""
    def one(bounds=None):
        n = draw(st.integers(0, 5)) if bounds is None else len(bounds)
        if bounds is None:
            bounds = draw(st.lists(ANY_NUMBER, min_size=n, max_size=n))
            bounds = tuple(sorted(bounds) if draw(st.booleans()) else bounds)
        counts = np.array(draw(st.lists(ANY_NUMBER, min_size=n, max_size=n)), dtype=np.float64)
        return BucketHistogram(bounds, counts, draw(ANY_NUMBER))
    first = one()
    return first, one(first.bounds_s if draw(st.booleans()) else None)


@QUIET
@settings(max_examples=300, deadline=1000)
@given(two_bucket_histograms(), ANY_NUMBER)
def test_bucket_histogram_arithmetic_never_raises(pair, x):
    a, b = pair
    for h in (a, a.plus(b), a.minus(b), b.rebinned(a.bounds_s), a.plus(a)):
        assert isinstance(h.count, int)
        assert len(h.quantiles((0.0, 0.5, 0.99, 1.0, x))) == 5
        h.mean(), h.fraction_above(x)


@QUIET
@settings(max_examples=200, deadline=1000)
@given(st.lists(st.integers(-(1 << 63), (1 << 63) - 1), max_size=SLOTS), st.integers(0, SLOTS - 1),
       st.lists(st.integers(-(1 << 63), (1 << 63) - 1), max_size=8), ANY_NUMBER,
       st.floats(-1e12, 1e12), st.floats(-1.0, 2.0))
def test_slot_histogram_arithmetic_never_raises(counts, lo, other, total_ns, threshold_s, q):
    a = Histogram(counts[:SLOTS - lo], total_ns, lo)
    b = Histogram(other, -total_ns)
    for h in (a, a.plus(b), a.minus(b), b.minus(a)):
        assert isinstance(h.count, int)
        h.quantiles((q, 0.5)), h.mean(), h.fraction_above(threshold_s), h.prometheus_buckets(export_bounds())
