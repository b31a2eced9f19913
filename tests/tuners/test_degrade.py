"""Degrade policies pinned on hand-computed cases, slotune's cooperation with the throttle,
purity, and the closed-loop load step."""
import math

import pytest

from bench.sim import degrade_bench
from tests.tuners.purity import assert_pure
from tuners import degrade, throttle

P = degrade.POLICIES
START = {"degrade_ratio": 0.0}


def obs(p99=0.5, slo=1.0, arrival=100.0, completed=100.0, degraded=0.0, refused=0.0, queue=None, now=1.0):
    return degrade.Observation(now=now, slo_s=slo, p99_s=p99, arrival_rps=arrival, completed_rps=completed,
                               degraded_rps=degraded, refused_rps=refused, queue_p99_s=queue)


def test_whitepaper_degrades_everything_on_the_third_period_over_and_nothing_at_the_first_under():
    wp = P["whitepaper"]
    s, ratios = wp.initial_state(START), []
    for p99 in (1.2, 1.3, 1.1, 1.4, 0.9, 1.2, 0.8):
        s, d = wp.decide(s, obs(p99=p99))
        ratios.append(d.changes.get("degrade_ratio"))
    assert ratios == [None, None, 1.0, None, 0.0, None, None]
    idle, d = wp.decide(s, obs(p99=0.0, completed=0.0))
    assert idle == s and d.changes == {}


def test_brownout_follows_klein_s_controller_with_its_rls_estimate():
    bo = P["brownout"]
    s = bo.initial_state(START)              # theta 1, alpha 1, P 1000
    s, d = bo.decide(s, obs(p99=1.0))        # the model's prediction (alpha * theta = 1): alpha stays 1
    assert s.alpha == pytest.approx(1.0)
    assert d.changes["degrade_ratio"] == pytest.approx(0.1 * 0.25)   # (1 - 0.9) / 1 * (0.75 - 1.0)
    theta, p = 1 - 0.025, s.p
    a = p * theta
    g = 1 / (theta * a + 0.95)
    alpha = 1.0 + g * a * (1.5 - theta * 1.0)
    s, d = bo.decide(s, obs(p99=1.5))
    assert s.alpha == pytest.approx(alpha)
    assert d.changes["degrade_ratio"] == pytest.approx(1 - (theta + 0.1 / alpha * (0.75 - 1.5)))


def test_slotune_cuts_the_full_answers_on_a_queue_over_budget_and_follows_the_offered_load():
    sl = P["slotune"]
    # tail 0.4 s: the throttle allows max(0.8 - 0.4, 0.25 * 0.4) = 0.4 s of queue, the dimmer 0.9 of it
    s, d = sl.decide(sl.initial_state(START), obs(p99=0.9, queue=0.5, arrival=150.0))
    assert s.full_rps == pytest.approx(80.0)                         # factor (0.396 / 0.536) held at 0.8
    assert d.changes["degrade_ratio"] == pytest.approx(1 - 80 / 150)
    s, d = sl.decide(s, obs(p99=0.5, queue=0.1, arrival=300.0, completed=150.0, degraded=70.0))
    assert s.full_rps == pytest.approx(88.0)                         # within budget: x1.1
    assert d.changes["degrade_ratio"] == pytest.approx(1 - 88 / 300)  # the doubled load, at once
    s, d = sl.decide(s, obs(p99=0.5, queue=0.1, arrival=80.0, completed=80.0, degraded=20.0))
    assert d.changes == {"degrade_ratio": 0.0} and s.full_rps == pytest.approx(96.8)
    s, d = sl.decide(s, obs(p99=0.5, queue=0.1, arrival=80.0, completed=80.0))
    assert d.changes == {} and s.full_rps == pytest.approx(96.8)     # not degrading: the rate is kept
    s, d = sl.decide(s, obs(p99=0.5, queue=0.1, arrival=200.0, completed=200.0))
    assert d.changes["degrade_ratio"] == pytest.approx(1 - 96.8 / 200)   # a surge over it: degraded at once


def test_slotune_degrades_more_wherever_the_throttle_would_cut_its_limit():
    cuts = 0
    for tail in (0.1, 0.4, 0.7, 0.9):
        for queue in (0.01, 0.05, 0.1, 0.2, 0.3, 0.5):
            t_obs = throttle.Observation(now=1.0, slo_s=1.0, p50_s=0.1, p90_s=0.2, p99_s=tail + queue,
                                         arrival_rps=150.0, completed_rps=100.0, goodput_rps=90.0, rejected_rps=0.0,
                                         in_flight=32.0, queue_p99_s=queue)
            if throttle.POLICIES["slotune"].decide(throttle.SlotuneState(32.0), t_obs)[0].limit < 32.0:
                cuts += 1
                _, d = P["slotune"].decide(degrade.SlotuneState(0.3, 100.0), obs(p99=tail + queue, queue=queue,
                                                                                  arrival=150.0))
                assert d.changes["degrade_ratio"] > 0.3, (tail, queue)
    assert cuts == 6                     # queue over max(0.8 - tail, 0.25 x tail)


def test_slotune_degrades_more_while_the_throttle_refuses_and_not_past_everything():
    sl = P["slotune"]
    s, d = sl.decide(degrade.SlotuneState(0.4, 60.0), obs(p99=0.3, queue=0.0, arrival=100.0, refused=10.0))
    assert s.full_rps == pytest.approx(54.0) and d.changes["degrade_ratio"] == pytest.approx(0.46)
    s, d = sl.decide(degrade.SlotuneState(1.0, 0.0), obs(p99=0.9, queue=0.6, arrival=500.0, refused=300.0))
    assert d.changes == {} and s.full_rps == 0                       # all degraded: refusing is the throttle's
    assert s.fast_below_rps == math.inf            # an overload from no full answers says nothing of their rate


def test_slotune_comes_back_from_degrading_everything():
    # from 5 % of the load: x1.5 with no queue (under a fifth of its 450 ms budget), x1.1 nearer it
    s, d = P["slotune"].decide(degrade.SlotuneState(1.0, 0.0), obs(p99=0.3, queue=0.0, arrival=100.0))
    assert s.full_rps == pytest.approx(7.5) and d.changes["degrade_ratio"] == pytest.approx(0.925)
    s, d = P["slotune"].decide(degrade.SlotuneState(1.0, 0.0), obs(p99=0.3, queue=0.2, arrival=100.0))
    assert s.full_rps == pytest.approx(5.5) and d.changes["degrade_ratio"] == pytest.approx(0.945)


def test_slotune_grows_fast_only_under_half_the_rate_its_last_overload_began_at():
    sl = P["slotune"]
    # an overload begins at 60 full answers/s (refusals): the threshold is 30; a second cut in a row keeps it
    s, _ = sl.decide(degrade.SlotuneState(0.4, 60.0), obs(p99=0.3, queue=0.0, arrival=100.0, refused=10.0))
    assert (s.full_rps, s.fast_below_rps, s.cutting) == (pytest.approx(54.0), 30.0, True)
    s, _ = sl.decide(s, obs(p99=0.9, queue=0.6, arrival=100.0, completed=90.0, degraded=50.0))
    assert s.full_rps == pytest.approx(32.0) and s.fast_below_rps == 30.0      # 40 x 0.8
    # the queue drained: from 32 full answers/s, over the threshold, x1.1 however empty the queue
    s, d = sl.decide(s, obs(p99=0.3, queue=0.0, arrival=100.0, completed=100.0, degraded=68.0))
    assert s.full_rps == pytest.approx(35.2) and not s.cutting
    # cut deep under it, the same empty queue grows x1.5
    s, d = sl.decide(degrade.SlotuneState(0.9, 10.0, 30.0), obs(p99=0.3, queue=0.0, arrival=100.0, degraded=90.0))
    assert s.full_rps == pytest.approx(15.0) and d.changes["degrade_ratio"] == pytest.approx(0.85)


def test_the_ratio_in_force_is_what_every_policy_steers_from():
    for name, p in P.items():
        synced = p.resync(p.initial_state({"degrade_ratio": 0.2}), {"degrade_ratio": 0.6})
        assert synced.ratio == 0.6, name


def test_bad_ratio_is_named():
    with pytest.raises(ValueError, match=r"degrade_ratio = 1.5 is outside 0..1"):
        P["slotune"].initial_state({"degrade_ratio": 1.5})
    with pytest.raises(ValueError, match=r"degrade tuner needs the current value of setting 'degrade_ratio'"):
        P["brownout"].initial_state({})


def test_policies_are_pure():
    seq = [obs(p99=p, queue=q, arrival=a, completed=min(a, 120.0), degraded=dg, refused=max(0.0, a - 140.0))
           for p, q, a, dg in ((0.5, 0.0, 80, 0), (1.2, 0.6, 180, 0), (1.1, 0.4, 200, 50), (0.9, 0.2, 220, 90),
                               (0.4, 0.0, 100, 30), (0.0, None, 0, 0), (0.6, 0.1, 90, 0))]
    assert_pure(P, START, seq)


def test_closed_loop_load_step_slotune_answers_most_within_the_slo_and_refuses_least():
    runs = {p: degrade_bench.run_one(p, "step", seed=0, quick=False) for p in degrade_bench.POLICIES}
    best = max((p for p in runs if p != "oracle"), key=lambda p: runs[p]["half_credit"])
    assert best == "slotune", {p: r["half_credit"] for p, r in runs.items()}
    assert runs["slotune"]["refused"] < 0.05 < runs["no_dimmer"]["refused"]
    assert runs["whitepaper"]["degraded"] == 0.0          # beside the throttle its 3-periods rule never fires
    assert math.isclose(runs["oracle"]["half_credit"], 0.838, abs_tol=0.01)
