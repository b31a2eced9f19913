"""Sampling policies pinned on hand-computed cases, plus a closed-loop budget test."""
import math

import numpy as np

from bench.sim import sampling_bench
from tests.tuners.purity import assert_pure
from slotune.tuners import sampling

P = sampling.POLICIES


def obs(req=200.0, err=0.0, p90=0.05, p99=0.1, kept=10.0, budget=10.0, now=1.0):
    return sampling.Observation(now=now, request_rps=req, error_rps=err, p90_s=p90, p99_s=p99,
                                kept_rps=kept, budget_traces_per_s=budget)


def test_whitepaper_formula_on_its_own_table():
    # the whitepaper's table promises 15 %, 62 % and 100 %; its formula gives these
    assert math.isclose(sampling.whitepaper_rate(32, 0.0002), 0.7 + 0.3 * 0.302)
    assert math.isclose(sampling.whitepaper_rate(840, 0.001), 0.7 * (1 - 790 / 1500) + 0.3 * 0.31)
    assert math.isclose(sampling.whitepaper_rate(120, 0.035), 0.7 * (1 - 70 / 1500) + 0.3 * 0.65)
    assert sampling.whitepaper_rate(5000, 0.5) == 0.7 * 0.1 + 0.3


def test_jaeger_waits_60_s_then_scales_with_a_capped_increase():
    j = P["jaeger"]
    s = j.initial_state({"trace_sample_rate": 0.1})
    for t in range(59):
        s, d = j.decide(s, obs(kept=40.0, now=t + 1))
        assert d.changes == {}
    s, d = j.decide(s, obs(kept=40.0, now=60))
    assert math.isclose(d.changes["trace_sample_rate"], 0.1 * 10 / 40)
    for t in range(60):
        s, d = j.decide(s, obs(kept=1.0, now=61 + t))
    assert math.isclose(d.changes["trace_sample_rate"], 0.025 * 1.5)   # x10 wanted, +50 % allowed
    for t in range(60):
        s, d = j.decide(s, obs(kept=8.0, now=121 + t))
    assert d.changes == {}                                                 # within 30 % of target


def test_slotune_spends_the_budget_left_after_the_tail_rule():
    sl = P["slotune"]
    s = sl.initial_state({"trace_sample_rate": 0.1})
    s, d = sl.decide(s, obs(req=200, err=2, p99=0.2))
    tail = 2 + 0.015 * 200
    assert math.isclose(d.changes["trace_sample_rate"], (10 - tail) / (200 - tail))
    assert math.isclose(d.changes["trace_keep_slower_than_s"], 0.85 * 0.2)
    s, d = sl.decide(s, obs(req=5, err=0, kept=5))                        # fewer requests than budget
    assert d.changes["trace_sample_rate"] == 1.0


def test_policies_are_pure():
    seq = [obs(req=100 + 10 * k, err=k, p90=0.01 * k, p99=0.02 * k, kept=5 + k, now=k) for k in range(1, 70)]
    assert_pure(P, {"trace_sample_rate": 0.2}, seq)


def test_slotune_holds_the_budget_and_keeps_every_error():
    res = {p: [sampling_bench.run_one(p, "error_bursts", seed, quick=True) for seed in (1, 2)]
           for p in ("slotune", "whitepaper", "jaeger")}
    err = {p: np.median([r["budget_error"] for r in rs]) for p, rs in res.items()}
    assert err["slotune"] < err["whitepaper"] and err["slotune"] < err["jaeger"]
    assert min(r["errors_kept"] for r in res["slotune"]) > 0.95
