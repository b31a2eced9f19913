"""Batch policies pinned on hand-computed cases, plus the closed-loop step test."""
import math

import numpy as np

from bench.sim import batch_bench
from tests.tuners.purity import assert_pure
from tuners import batch

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


def test_policies_are_pure():
    seq = [obs(now=5.0 * k, p99=0.02 * k, batches=((k, 3, 0.01 + 0.002 * k), (2 * k, 3, 0.01 + 0.004 * k)))
           for k in range(1, 8)]
    assert_pure(P, START, seq)


def test_slotune_beats_whitepaper_on_the_step_and_nears_the_oracle():
    res = {p: [batch_bench.run_one(p, "step", seed, quick=True) for seed in (1, 2)] for p in ("slotune", "whitepaper")}
    good = {p: np.median([r["goodput_ratio"] for r in rs]) for p, rs in res.items()}
    assert good["slotune"] > good["whitepaper"]
    assert np.median([r["regret"] for r in res["slotune"]]) <= 0.05
