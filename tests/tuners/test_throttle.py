"""Throttle policies pinned on hand-computed cases, plus the closed-loop step test."""
import math
from dataclasses import replace

import numpy as np
import pytest

from bench.sim import throttle_bench
from tests.tuners.purity import assert_pure
from slotune.tuners import throttle

P = throttle.POLICIES


def obs(p50=0.1, p99=0.2, in_flight=20.0, slo=0.3, now=1.0, completed=100.0, rejected=0.0, queue_p99=0.0):
    return throttle.Observation(now=now, slo_s=slo, p50_s=p50, p90_s=p50, p99_s=p99, arrival_rps=completed + rejected,
                                completed_rps=completed, goodput_rps=completed, rejected_rps=rejected,
                                in_flight=in_flight, queue_p99_s=queue_p99)


def test_whitepaper_aimd_rate():
    s = P["whitepaper"].initial_state({"rate_limit_rps": 100})
    s, d = P["whitepaper"].decide(s, obs(p99=0.5))
    assert d.changes == {"rate_limit_rps": 90.0}
    s, d = P["whitepaper"].decide(s, obs(p99=0.1))
    assert math.isclose(d.changes["rate_limit_rps"], 99.0)


def test_whitepaper_rule_on_a_concurrency_limit():
    s = P["aimd"].initial_state({"concurrency_limit": 40})
    s, d = P["aimd"].decide(s, obs(p99=0.5))
    assert d.changes == {"concurrency_limit": 36.0}
    s, d = P["aimd"].decide(s, obs(p99=0.1))
    assert math.isclose(d.changes["concurrency_limit"], 39.6)
    s, d = P["aimd"].decide(P["aimd"].initial_state({"concurrency_limit": 2}), obs(p99=0.1))
    assert d.changes == {"concurrency_limit": 3.0}                 # +1 at least: a limit of 2 grows too
    assert P["aimd"].decide(s, obs(completed=0.0, p50=0.0))[1].changes == {}


def test_gradient2_formula():
    g = P["gradient2"]
    s = g.initial_state({"concurrency_limit": 20})
    s, d = g.decide(s, obs(p50=0.1))          # long = short: gradient 1, +4 queue, smoothing 0.2
    assert math.isclose(d.changes["concurrency_limit"], 20 * 0.8 + (20 + 4) * 0.2)
    s, d = g.decide(s, obs(p50=0.4))          # long rtt (0.1+0.4)/2 = 0.25, gradient 1.5*0.25/0.4
    expected = 20.8 * 0.8 + (20.8 * 0.9375 + 4) * 0.2
    assert math.isclose(d.changes["concurrency_limit"], expected)


def test_gradient2_holds_when_app_limited():
    g = P["gradient2"]
    s, d = g.decide(g.initial_state({"concurrency_limit": 20}), obs(in_flight=9))
    assert d.changes == {} and s.limit == 20


def test_vegas_alpha_beta():
    v = P["vegas"]
    s = v.initial_state({"concurrency_limit": 20})
    s, d = v.decide(s, obs(p50=0.1))          # first sample sets rtt_noload
    assert d.changes == {} and s.rtt_noload == 0.1
    s, d = v.decide(s, obs(p50=0.1))          # queue 0 <= threshold 1: + beta (6)
    assert d.changes == {"concurrency_limit": 26.0}
    s, d = v.decide(s, obs(p50=0.2, in_flight=26))  # queue ceil(26*0.5) = 13 > beta: - log10 (1)
    assert d.changes == {"concurrency_limit": 25.0}


def test_envoy_min_rtt_window_then_gradient():
    e = P["envoy"]
    s = e.initial_state({"concurrency_limit": 50})
    s, d = e.decide(s, obs(now=1))
    assert d.changes == {"concurrency_limit": 3.0}
    s, d = e.decide(s, obs(now=2, p50=0.5))    # drains the queue built before the pin
    s, d = e.decide(s, obs(now=3, p50=0.05, completed=60))
    assert d.changes == {"concurrency_limit": 50.0} and s.min_rtt == 0.05
    s, d = e.decide(s, obs(now=4, p50=0.1))    # gradient 0.05*1.25/0.1 = 0.625, + sqrt headroom
    assert math.isclose(d.changes["concurrency_limit"], 31.25 + math.sqrt(31.25))


def test_slotune_cuts_on_queue_over_budget_and_grows_when_binding():
    sl = P["slotune"]
    s = sl.initial_state({"concurrency_limit": 40})
    # SLO 0.3: target 0.24; service tail 0.2 -> queue budget max(0.04, 0.05) = 0.05
    s2, d = sl.decide(s, obs(p99=0.4, queue_p99=0.2, in_flight=40))
    assert math.isclose(d.changes["concurrency_limit"], 40 * 0.5)    # (0.05+0.005)/(0.2+0.005) < 0.5
    s3, d = sl.decide(s, obs(p99=0.1, queue_p99=0.0, rejected=5))
    assert math.isclose(d.changes["concurrency_limit"], 44.0)        # binding, no queue: x1.1
    s4, d = sl.decide(s, obs(p99=0.1, queue_p99=0.0, in_flight=10))
    assert d.changes == {}                                           # not binding: hold


def test_slotune_gives_the_limit_back_when_load_drops_but_never_past_where_it_started():
    sl = P["slotune"]
    s = sl.resync(sl.initial_state({"concurrency_limit": 40}), {"concurrency_limit": 20})   # a cut in force
    quiet = obs(p99=0.1, queue_p99=0.01, in_flight=2)      # queue 10 ms, under half its 150 ms budget
    s, d = sl.decide(s, quiet)
    assert math.isclose(d.changes["concurrency_limit"], 22.0)
    for _ in range(10):
        s, d = sl.decide(s, quiet)
    assert s.limit == 40.0 and d.changes == {}
    s = sl.resync(s, {"concurrency_limit": 20})
    _, d = sl.decide(s, obs(p99=0.2, queue_p99=0.1, in_flight=2))    # 100 ms: over half its 140 ms budget: hold
    assert d.changes == {}


def test_slotune_holds_once_two_cuts_left_p99_where_it_was_and_when_the_limit_is_not_what_queues():
    """CPU contention reads as queueing (P99 above its no-load tail); two cuts that did not
    lower P99 show the wait is not at this limit: hold, not cut to a few in flight."""
    sl = P["slotune"]
    s = sl.initial_state({"concurrency_limit": 40})
    slow = dict(p99=0.4, queue_p99=0.2)            # over the 50 ms budget: x0.5
    for in_flight in (40, 20, 20, 10):             # cut, the window after it held, cut, held
        s, d = sl.decide(s, obs(**slow, in_flight=in_flight))
    assert s.limit == 10.0 and s.cuts == 2
    s, d = sl.decide(s, obs(**slow, in_flight=10))
    assert d.changes == {} and "did not lower P99" in d.reason
    s, d = sl.decide(s, obs(p99=0.35, queue_p99=0.2, in_flight=10))   # P99 falls: the queue drains, held
    assert d.changes == {} and "its queue drains" in d.reason
    s, d = sl.decide(s, obs(p99=0.35, queue_p99=0.2, in_flight=10))   # it fell, then stays: a cut helps again
    assert d.changes == {"concurrency_limit": 5.0}
    s = sl.initial_state({"concurrency_limit": 40})
    s, _ = sl.decide(s, obs(**slow, in_flight=40))
    s, _ = sl.decide(sl.resync(s, {"concurrency_limit": 40}), obs(**slow, in_flight=40))   # the cut was rolled back
    assert s.cuts == 1 and s.limit == 20.0                       # so it is not counted: this is the first that stays
    s = sl.initial_state({"concurrency_limit": 40})
    _, d = sl.decide(s, obs(**slow, in_flight=12))   # 12 in flight under a limit of 40
    assert d.changes == {} and "under half the limit" in d.reason


def test_slotune_holds_a_cut_while_the_queue_it_left_drains():
    """The queue an old limit let build drains at the new one over as many windows as it is
    deep: while P99 falls a tenth or more a window, a second cut would halve a limit that holds."""
    sl = P["slotune"]
    s = sl.initial_state({"concurrency_limit": 32})
    s, d = sl.decide(s, obs(p99=0.9, queue_p99=0.6, in_flight=32))          # cut to 16
    s, d = sl.decide(s, obs(p99=0.9, queue_p99=0.6, in_flight=16))          # the window after it: held
    for p99 in (0.8, 0.7):                                                   # falling: held
        s, d = sl.decide(s, obs(p99=p99, queue_p99=p99 - 0.3, in_flight=16))
        assert d.changes == {} and "its queue drains" in d.reason and s.limit == 16.0
    s, d = sl.decide(s, obs(p99=0.68, queue_p99=0.38, in_flight=16))        # no longer falling: cut
    assert d.changes["concurrency_limit"] < 16.0


def test_slotune_judges_a_cut_on_the_window_after_the_one_it_held():
    """The window after a cut holds the answers admitted before it, which waited behind the
    old limit: one cut, one window held, then the queue under the new limit decides."""
    sl = P["slotune"]
    s = sl.initial_state({"concurrency_limit": 40})
    over = obs(p99=0.4, queue_p99=0.2, in_flight=40)
    s, d = sl.decide(s, over)
    assert d.changes == {"concurrency_limit": 20.0}
    s, d = sl.decide(s, over)                                       # the same queue, a window later
    assert d.changes == {} and "held one" in d.reason and s.limit == 20.0
    s, d = sl.decide(s, over)                                       # still over: cut again
    assert d.changes == {"concurrency_limit": 10.0}
    s, d = sl.decide(sl.resync(s, {"concurrency_limit": 20}), over)   # that cut did not land: no hold
    assert d.changes == {"concurrency_limit": 10.0}


def test_slotune_lets_a_dimmer_with_room_go_first_while_p99_is_within_the_slo():
    sl = P["slotune"]
    s = sl.initial_state({"concurrency_limit": 40})
    over_budget = dict(p99=0.28, queue_p99=0.2, in_flight=40)     # budget 50 ms, P99 under the 300 ms SLO
    _, d = sl.decide(s, replace(obs(**over_budget), degrade_room=True))
    assert d.changes == {} and "dimmer" in d.reason
    _, d = sl.decide(s, obs(**over_budget))                        # no dimmer, or it degrades all already
    assert d.changes["concurrency_limit"] < 40
    _, d = sl.decide(s, replace(obs(p99=0.4, queue_p99=0.2, in_flight=40), degrade_room=True))   # over the SLO: cut
    assert d.changes["concurrency_limit"] < 40


@pytest.mark.parametrize("name", sorted(P))
def test_no_policy_starts_from_or_steers_a_limit_of_0_in_force(name):
    """0 is the reference gateway's and HAProxy's "no limit": read as a limit of 1 that binds,
    it made the first push the bound's minimum (2 queries at once on an unlimited gateway)."""
    policy = P[name]
    limit, = policy.fields
    none_of_it = f"{limit} is 0 in force, which the service reads as no limit"
    with pytest.raises(ValueError, match=none_of_it + r".*give the service a starting " + limit):
        policy.initial_state({limit: 0.0})
    state = policy.resync(policy.initial_state({limit: 40.0}), {limit: 0.0})    # set to none by hand later
    for o in (obs(p99=0.1, queue_p99=0.0, in_flight=5), obs(p99=0.4, queue_p99=0.2, in_flight=5)):
        with pytest.raises(ValueError, match=none_of_it):
            policy.decide(state, o)


def test_slotune_without_a_queue_measurement_steers_p99_to_80_percent_of_the_slo():
    sl = P["slotune"]
    s = sl.initial_state({"concurrency_limit": 40})
    _, d = sl.decide(s, obs(p99=0.3, queue_p99=None, in_flight=40))    # (0.24+0.024)/(0.3+0.024)
    assert math.isclose(d.changes["concurrency_limit"], 40 * 0.264 / 0.324)
    _, d = sl.decide(s, obs(p99=0.2, queue_p99=None, in_flight=40))    # under 0.24, binding: x1.1 at most
    assert math.isclose(d.changes["concurrency_limit"], 44.0)


def test_slotune_on_ttft_cuts_on_a_queue_building_before_first_tokens_show_it():
    """P99 of first tokens still under its aim, but 60 waiting at 30 completed a second: 2 s ahead."""
    sl = P["slotune"]
    s = sl.initial_state({"concurrency_limit": 64})
    building = replace(obs(p99=0.4, queue_p99=None, in_flight=64, slo=1.0, completed=30.0), wait_ahead_s=2.0)
    _, d = sl.decide(s, building)
    assert math.isclose(d.changes["concurrency_limit"], 64 * max(0.5, 0.88 / 2.08))
    _, d = sl.decide(s, replace(building, wait_ahead_s=0.1))      # a short queue: the first tokens' P99 decides
    assert math.isclose(d.changes["concurrency_limit"], 64 * 1.1)


def test_slotune_on_ttft_gives_back_an_engines_queue_that_buys_no_throughput():
    """Binding, TTFT within its aim: grown while the engine has no queue of its own, kept with
    up to a batch waiting, cut toward one batch waiting with more (half the limit at most a
    step, none in the window after a cut: it holds what the old limit let in). A real vLLM ran
    at capacity at maxconn 8 with 4 running; at 26-31 its first tokens waited 0.8 s longer for
    the same throughput. Over its aim, a cut goes as deep, a quarter of the limit at most."""
    sl = P["slotune"]
    s = sl.initial_state({"concurrency_limit": 30})
    binding = obs(p99=0.3, queue_p99=None, in_flight=30, slo=1.0, completed=30.0, rejected=5.0)
    moves = {e: sl.decide(s, replace(binding, engine=e))[1].changes.get("concurrency_limit")
             for e in (None, (4.0, 0.0), (4.0, 2.0), (4.0, 26.0), (7.0, 23.0))}
    assert moves == {None: 33.0, (4.0, 0.0): 33.0, (4.0, 2.0): None, (4.0, 26.0): 15.0, (7.0, 23.0): 15.0}
    after_a_cut = replace(s, just_cut=True)
    assert not sl.decide(after_a_cut, replace(binding, engine=(4.0, 26.0)))[1].changes
    over = replace(binding, p99_s=1.5, engine=(4.0, 26.0))
    assert sl.decide(s, over)[1].changes["concurrency_limit"] == 8.0
    s64 = sl.initial_state({"concurrency_limit": 64})
    assert sl.decide(s64, replace(over, in_flight=64))[1].changes["concurrency_limit"] == 16.0


def test_policies_are_pure():
    seq = [obs(now=t, p50=0.05 * t, p99=0.1 * t, queue_p99=0.02 * t, in_flight=30) for t in range(1, 6)]
    assert_pure(P, {"concurrency_limit": 30.0, "rate_limit_rps": 100.0}, seq)


def test_slotune_beats_whitepaper_on_the_3x_step():
    """Closed loop, fixed seeds: 0.5C -> 1.5C -> 0.5C; slotune settles within 3 intervals and
    spends at most half the whitepaper's seconds with P99 over the SLO."""
    runs = {p: [throttle_bench.run_one(p, "step", seed, quick=True) for seed in (1, 2)] for p in ("slotune", "whitepaper")}
    over = {p: np.median([r["over_slo_s"] for r in rs]) for p, rs in runs.items()}
    assert over["slotune"] <= over["whitepaper"] / 2
    assert np.median([r["settle_s"] for r in runs["slotune"]]) <= 3
    assert np.median([r["goodput_ratio"] for r in runs["slotune"]]) > np.median([r["goodput_ratio"] for r in runs["whitepaper"]])
