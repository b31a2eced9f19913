"""Breaker policies pinned on hand-computed cases, plus a closed-loop outage test."""
import math

from bench.sim import breaker_bench
from tests.tuners.purity import assert_pure
from slotune.tuners import breaker

P = breaker.POLICIES
START = {"breaker_failure_threshold": 0.5, "breaker_consecutive_failures": 0, "breaker_open_s": 30}


def obs(now=1.0, calls=20, failures=0, is_open=False):
    return breaker.Observation(now=now, calls=calls, failures=failures, breaker_open=is_open)


def test_whitepaper_threshold_formula():
    assert breaker.whitepaper_threshold(0.001) == 0.003
    assert math.isclose(breaker.whitepaper_threshold(0.01), 0.008)


def test_whitepaper_recalibrates_after_three_bad_30_s_samples():
    wp = P["whitepaper"]
    s = wp.initial_state(START)
    changes = []
    for t in range(1, 91):          # 1 % failures: every 30 s sample is above 0.25 %
        s, d = wp.decide(s, obs(now=t, calls=100, failures=1))
        changes.append(d.changes)
    assert all(c == {} for c in changes[:89])
    assert math.isclose(changes[89]["breaker_failure_threshold"], 0.008)


def test_anchor_defaults():
    s, d = P["pybreaker"].decide(P["pybreaker"].initial_state(START), obs())
    assert d.changes == {"breaker_failure_threshold": 2.0, "breaker_consecutive_failures": 5.0, "breaker_open_s": 60.0}
    s, d = P["resilience4j"].decide(P["resilience4j"].initial_state(START), obs())
    assert d.changes == {"breaker_open_s": 60.0}


def test_wilson_upper_bound():
    # 0 failures in 100 calls, z = 3: 9 / 109
    assert math.isclose(breaker.wilson_upper(0, 100), 9 / 109)
    assert breaker.wilson_upper(0, 0) == 1.0


def test_run_length_is_rare_for_a_healthy_tool():
    k = breaker.run_length(0.01, 20.0)          # 20 calls/s for 1000 h: 7.2e7 starts
    assert 0.01 ** k * 7.2e7 < 1 <= 0.01 ** (k - 1) * 7.2e7
    assert breaker.run_length(1e-6, 20.0) == 3


def test_probe_period_balances_failed_probes_against_idle_recovery():
    assert math.isclose(breaker.longest_open_s(20.0), math.sqrt(6.0))
    assert breaker.longest_open_s(0.0) == 60.0 and breaker.longest_open_s(1e6) == 1.0


def test_slotune_backs_off_while_probes_fail_and_resets_on_close():
    sl = P["slotune"]
    s, d = sl.decide(sl.initial_state(START), obs(calls=20, failures=20, is_open=True))  # trips
    assert s.breaker.open_s == 1.0 and s.breaker.threshold == 0.5
    for expected in (2.0, 4.0, 8.0, math.sqrt(120), math.sqrt(120)):                # 1 call/s: cap sqrt(2*60/1)
        s, d = sl.decide(s, obs(calls=1, failures=1, is_open=True))                    # probe failed
        assert math.isclose(s.breaker.open_s, expected)
    s, d = sl.decide(s, obs(calls=5, failures=0, is_open=False))
    assert d.changes["breaker_open_s"] == 1.0


def test_policies_are_pure():
    seq = [obs(now=t, calls=20, failures=(20 if 40 < t < 60 else t % 2), is_open=40 < t < 65) for t in range(1, 100)]
    assert_pure(P, START, seq)


def test_slotune_loses_fewer_calls_than_the_whitepaper_in_an_outage():
    lost = {p: breaker_bench.run_one(p, "outage", 3, quick=True)["lost_calls"] for p in ("slotune", "whitepaper")}
    assert lost["slotune"] < lost["whitepaper"]
