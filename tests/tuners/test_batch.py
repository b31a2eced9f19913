"""Batch policies pinned on hand-computed cases, plus the closed-loop step test."""
import math

import numpy as np

from bench.sim import batch_bench
from tests.tuners.purity import assert_pure
from slotune.tuners import batch

P = batch.POLICIES
START = {"max_batch_size": 8, "max_queue_delay_ms": 5}


def obs(now=30.0, p99=0.1, slo=0.2, batches=((4, 10, 0.025),), rate=100.0):
    return batch.Observation(now=now, slo_s=slo, p99_s=p99, arrival_rps=rate, goodput_rps=rate, batches=batches)


def test_whitepaper_formula():
    assert batch.whitepaper_size(200) == 128      # ((160 - 8.3) / 2.688)^2 = 3185 -> clamp 128
    assert batch.whitepaper_size(120) == 128      # 1726: the whitepaper's own "b <= 34.7" does not follow
    assert batch.whitepaper_size(20) == 8         # ((16 - 8.3) / 2.688)^2 = 8.2
    assert batch.whitepaper_size(10) == 1


def test_whitepaper_recomputes_every_30_s_only():
    wp = P["whitepaper"]
    s, d = wp.decide(wp.initial_state(START), obs(now=30, slo=0.02))
    assert d.changes == {}                        # b = 8 already
    s, d = wp.decide(wp.initial_state(START), obs(now=30, slo=0.2))
    assert d.changes == {"max_batch_size": 128.0}
    s2, d = wp.decide(s, obs(now=45, slo=0.02))
    assert d.changes == {}
    s3, d = wp.decide(s, obs(now=60, slo=0.02))
    assert d.changes == {"max_batch_size": 8.0}


def test_clipper_additive_increase_multiplicative_decrease():
    c = P["clipper_aimd"]
    s, d = c.decide(c.initial_state(START), obs(batches=((8, 5, 0.1),), slo=0.2))
    assert d.changes == {"max_batch_size": 10.0}
    s, d = c.decide(s, obs(batches=((10, 5, 0.25),), slo=0.2))
    assert d.changes == {"max_batch_size": 9.0}          # int(10 * 0.9)


def test_triton_doubles_then_keeps_the_last_good_size():
    t = P["triton"]
    s = t.initial_state(START)
    s, d = t.decide(s, obs(p99=0.1))
    assert d.changes == {"max_batch_size": 16.0}
    s, d = t.decide(s, obs(p99=0.3))
    assert d.changes == {"max_batch_size": 8.0} and s.done
    s, d = t.decide(s, obs(p99=0.01))
    assert d.changes == {}


def test_slotune_fits_a_plus_cb_and_sizes_for_the_slo():
    sl = P["slotune"]
    s = sl.initial_state(START)
    # exact data from 10 ms + 2 ms * b; SLO 200 ms: two batches fit while 10 + 2b <= 100 -> b = 45
    s, d = sl.decide(s, obs(p99=0.1, batches=((4, 10, 0.018), (16, 10, 0.042))))
    a, c = batch.fit_latency(s)
    assert math.isclose(a, 0.010, abs_tol=1e-9) and math.isclose(c, 0.002, abs_tol=1e-9)
    assert d.changes == {"max_batch_size": 45.0, "max_queue_delay_ms": 0.0}


def test_slotune_explores_until_two_sizes_seen():
    sl = P["slotune"]
    s, d = sl.decide(sl.initial_state(START), obs(batches=((8, 10, 0.03),)))
    assert d.changes["max_batch_size"] == 16.0


def test_slotune_grows_to_drain_a_backlog():
    sl = P["slotune"]
    s, _ = sl.decide(sl.initial_state(START), obs(p99=0.1, batches=((4, 10, 0.018), (16, 10, 0.042))))
    _, d = sl.decide(s, obs(p99=0.5, batches=((45, 10, 0.1),)))
    assert d.changes["max_batch_size"] == 67.0                       # full batches: int(45 * 1.5)
    _, d = sl.decide(s, obs(p99=0.5, batches=((45, 2, 0.1), (10, 8, 0.03))))
    assert "max_batch_size" not in d.changes                         # a slow batch, not a backlog


def test_slotune_waits_to_fill_slow_batches_then_stops():
    sl = P["slotune"]
    s, _ = sl.decide(sl.initial_state(START), obs(p99=0.1, batches=((4, 10, 0.018), (16, 10, 0.042))))
    # P99 over the SLO on batches well under the size (slow, not a backlog): wait a/2 = 10/2 ms to fill them
    s, d = sl.decide(s, obs(p99=0.5, batches=((45, 2, 0.1), (10, 8, 0.03))))
    assert set(d.changes) == {"max_queue_delay_ms"} and math.isclose(d.changes["max_queue_delay_ms"], 5.0)
    _, d = sl.decide(s, obs(p99=0.16, batches=((10, 10, 0.03),)))
    assert d.changes == {}                                           # 80 % of the SLO: keep waiting
    _, d = sl.decide(s, obs(p99=0.1, batches=((10, 10, 0.03),)))
    assert d.changes["max_queue_delay_ms"] == 0.0                    # 50 % of the SLO: no wait


def test_scatter_measures_the_spread_of_per_size_means_around_the_fit():
    # fit 10 ms + 2 ms*b: means of 10 batches at b = 4 and 16, 10 % above and 10 % below it
    ss, df = batch.scatter(((4, 10, 0.018 * 1.1), (16, 10, 0.042 * 0.9)), 0.010, 0.002)
    assert math.isclose(ss, 10 * 0.1 ** 2 + 10 * 0.1 ** 2) and df == 1.0   # CV^2 estimate 0.2
    ss, df = batch.scatter(((4, 10, 0.018 * 1.5), (16, 10, 0.042 * 1.5)), 0.010, 0.002)
    assert math.isclose(ss, 0.0, abs_tol=1e-12) and df == 1.0             # a common slowdown cancels
    assert batch.scatter(((4, 10, 0.03),), 0.010, 0.002) == (0.0, 0.0)    # one size: no estimate


def test_p99_factor_of_a_lognormal():
    assert batch.p99_factor(0.0) == 1.0
    assert math.isclose(batch.p99_factor(math.e - 1), math.exp(2.326 - 0.5))   # sigma 1: P99 = 6.21 x mean


def test_slotune_lifts_the_size_bound_when_batch_times_are_too_spread():
    sl = P["slotune"]
    # 1000 batches at each size pin the fit to 10 ms + 2 ms*b; the next windows barely move it
    s, _ = sl.decide(sl.initial_state(START), obs(p99=0.1, batches=((4, 1000, 0.018), (16, 1000, 0.042))))
    assert s.size == 45.0 and math.isclose(s.spread, 0.0, abs_tol=1e-12) and s.spread_df == 1.0
    # means of 10 batches 5 % above and below: CV^2 = 10 * 2 * 0.05^2 / (0.7 + 1) = 0.03, P99 1.47 x mean;
    # two batches of b = 1 then take 2 * 12 ms * 1.47 = 35 ms, within the 200 ms SLO: the bound stays
    _, d = sl.decide(s, obs(p99=0.1, batches=((4, 10, 0.018 * 1.05), (16, 10, 0.042 * 0.95))))
    assert "max_batch_size" not in d.changes
    # 2x and 0.2x: residuals +1 and -0.8 around their mean 0.1, CV^2 = 10 * 2 * 0.9^2 / 1.7 = 9.5,
    # P99 = exp(2.326 * 1.53 - 2.35 / 2) = 10.9 x mean: two batches of b = 1 take 262 ms > 200 ms
    _, d = sl.decide(s, obs(p99=0.5, batches=((4, 10, 0.018 * 2), (16, 10, 0.042 * 0.2))))
    assert d.changes["max_batch_size"] == 128.0 and "no bound on b" in d.reason


def test_policies_are_pure():
    seq = [obs(now=5.0 * k, p99=0.02 * k, batches=((k, 3, 0.01 + 0.002 * k), (2 * k, 3, 0.01 + 0.004 * k)))
           for k in range(1, 8)]
    assert_pure(P, START, seq)


def test_slotune_beats_whitepaper_on_the_step_and_nears_the_oracle():
    res = {p: [batch_bench.run_one(p, "step", seed, quick=True) for seed in (1, 2)] for p in ("slotune", "whitepaper")}
    good = {p: np.median([r["goodput_ratio"] for r in rs]) for p, rs in res.items()}
    assert good["slotune"] > good["whitepaper"]
    assert np.median([r["regret"] for r in res["slotune"]]) <= 0.05
