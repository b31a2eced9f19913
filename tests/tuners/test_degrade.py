"""Degrade policies pinned on hand-computed cases, slotune's cooperation with the throttle,
purity, and the closed-loop load step."""
import math

import pytest

from bench.sim import degrade_bench
from tests.tuners.purity import assert_pure
from slotune.tuners import degrade, throttle

P = degrade.POLICIES
START = {"degrade_ratio": 0.0}


PAYS = degrade.Verdict(125.0, 150.0, "degrading, it carried 150 worth/s; busy with full answers alone, 125/s",
                      mixed=True)


def obs(p99=0.5, slo=1.0, arrival=100.0, completed=100.0, degraded=0.0, refused=0.0, queue=None, now=1.0,
        verdict=PAYS):
    return degrade.Observation(now=now, slo_s=slo, p99_s=p99, arrival_rps=arrival, completed_rps=completed,
                               degraded_rps=degraded, refused_rps=refused, queue_p99_s=queue, verdict=verdict)


def busy(n, completed, degraded=0.0, refused=False, over=True):
    return [degrade.Busy(completed, degraded, 1.5 * completed, refused, over)] * n


def test_degrading_pays_when_it_carries_more_worth_than_full_answers_alone():
    # no busy window of full answers alone: nothing known
    assert degrade.verdict(busy(9, 150.0, 60.0, over=False), 0.5) == degrade.Verdict(
        why="0 busy window(s) of full answers alone, 2 needed")
    # full answers alone carried 100/s busy, two seconds in a row (the first of a run does not count);
    # degrading not yet seen long enough (a trial's first second settles, the next 2 count)
    known = degrade.verdict(busy(3, 100.0) + busy(2, 150.0, 60.0, over=False), 0.5)
    assert known.pays is None and known.mixed is None and known.full_rps == 100.0 and known.full_known
    # within budget, 150/s answered, 60 of them degraded: 150 - 0.5 x 60 = 120 worth/s > 100
    pays = degrade.verdict(busy(3, 100.0) + busy(3, 150.0, 60.0, over=False), 0.5)
    assert (pays.pays, pays.mixed, pays.worth_rps) == (True, True, 120.0)
    # a degraded answer that costs nearly a full one's work: 110 answered, 80 degraded, 70 worth/s; degrading
    # everything is still to try (in a batch as long as its longest answer, only a whole batch degraded saves)
    excess = degrade.verdict(busy(3, 100.0) + busy(3, 110.0, 80.0, over=False), 0.5)
    assert (excess.pays, excess.mixed, excess.whole) == (None, False, None)
    # ... and everything degraded carried 190 answers, 95 worth/s: it does not pay either
    assert degrade.verdict(busy(3, 100.0) + busy(3, 110.0, 80.0, over=False) + busy(3, 190.0, 190.0, over=False),
                           0.5).pays is False
    # ... 240 answers degraded, 120 worth/s: degrading everything pays where degrading some did not
    whole = degrade.verdict(busy(3, 100.0) + busy(3, 110.0, 80.0, over=False) + busy(3, 240.0, 240.0), 0.5)
    assert (whole.pays, whole.mixed, whole.whole, whole.worth_rps) == (True, False, True, 120.0)
    # worth 0.9 a degraded answer: the same 110 carry 102 worth/s, more than the 100 full answers
    assert degrade.verdict(busy(3, 100.0) + busy(3, 110.0, 80.0, over=False), 0.9).pays is True
    # a second the limiter refused in with no queue: it carried what the limit let through, left out
    assert degrade.verdict(busy(3, 100.0) + busy(10, 80.0, 60.0, refused=True, over=False), 0.5).mixed is None
    # refusing with its queue over budget all the same, it carried all it could: counted (90 - 30 = 60)
    v = degrade.verdict(busy(3, 100.0) + busy(3, 90.0, 60.0, refused=True, over=True), 0.5)
    assert (v.mixed, v.worth_rps) == (False, 60.0)


def test_slotune_tries_degrading_the_excess_then_everything_where_that_could_pay():
    sl, unknown = P["slotune"], degrade.Verdict(100.0, why="busy with full answers alone, 100/s",
                                                full_most_rps=110.0)
    # 150 offered over the 100 full answers carried busy, a queue over budget: degrade all but 0.9 x 100
    s, d = sl.decide(degrade.SlotuneState(0.0), obs(p99=0.9, queue=0.5, arrival=150.0, verdict=unknown))
    assert d.changes["degrade_ratio"] == pytest.approx(0.4) and "degrading the excess" in d.reason
    # no queue over budget, nothing refused: no trial
    s, d = sl.decide(degrade.SlotuneState(0.0), obs(p99=0.3, queue=0.0, arrival=150.0, verdict=unknown))
    assert s.ratio == 0.0 and d.changes == {}
    # the excess did not pay; degrading all carries at most 0.5 x 150 = 75 worth/s, under the 110 full
    # answers alone carried in their best busy second: not tried
    excess_not = degrade.Verdict(100.0, 70.0, "busy ...", mixed=False, full_most_rps=110.0)
    s, d = sl.decide(degrade.SlotuneState(0.4), obs(p99=0.9, queue=0.5, arrival=150.0, verdict=excess_not))
    assert d.changes == {"degrade_ratio": 0.0} and "does not pay at 150 queries/s" in d.reason
    assert not degrade.has_room(0.0, excess_not, 150.0, 0.5)
    # at 300 offered it may carry 150 > 110: everything degraded, and the throttle lets the dimmer go first
    s, d = sl.decide(degrade.SlotuneState(0.4), obs(p99=0.9, queue=0.5, arrival=300.0, verdict=excess_not))
    assert d.changes == {"degrade_ratio": 1.0} and "trying everything degraded" in d.reason
    assert degrade.has_room(0.4, excess_not, 300.0, 0.5) and not degrade.has_room(1.0, excess_not, 300.0, 0.5)


def test_slotune_lets_through_at_most_nine_tenths_of_what_full_answers_alone_carried_busy():
    # 50 full answers/s carried busy: growing from 60, the full rate stops at 45 (issue 43's e2e
    # step overshot capacity by growing x1.1 a tick while the queue's P99 lagged)
    carried = degrade.Verdict(50.0, 60.0, "degrading, it carried 60 worth/s; busy with full answers alone, 50/s",
                              mixed=True)
    s, d = P["slotune"].decide(degrade.SlotuneState(0.4, 60.0), obs(p99=0.3, queue=0.0, arrival=100.0,
                                                                    verdict=carried))
    assert s.full_rps == pytest.approx(45.0) and d.changes["degrade_ratio"] == pytest.approx(0.55)
    assert "at most 0.9 of the 50/s" in d.reason
    # a queue over budget with the load within what full answers carried busy: no degrading starts
    s, d = P["slotune"].decide(degrade.SlotuneState(0.0), obs(p99=0.9, queue=0.5, arrival=40.0, completed=40.0,
                                                             verdict=carried))
    assert s.ratio == 0.0 and d.changes == {} and "within the 50 full answers/s it carried busy" in d.reason


def test_slotune_degrades_nothing_until_full_answers_alone_were_seen_busy_nor_where_degrading_does_not_pay():
    sl = P["slotune"]
    for verdict in (degrade.Verdict(), degrade.Verdict(100.0, 70.0, "busy, degrading carried 70 ...",
                                                      False, False)):
        s, d = sl.decide(degrade.SlotuneState(0.6, 40.0), obs(p99=0.9, queue=0.5, arrival=150.0, verdict=verdict))
        assert s == degrade.SlotuneState(0.0) and d.changes == {"degrade_ratio": 0.0}
        assert ("does not pay" if verdict.pays is False else "nothing degraded until") in d.reason


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


def test_closed_loop_slotune_degrades_where_it_pays_refuses_where_it_does_not_and_neither_under_capacity():
    def run(policy, scenario):
        return degrade_bench.run_one(policy, scenario, seed=0, quick=False)
    # a degraded answer at a quarter of the work: degrading carries more than refusing
    cheap, alone = run("slotune", "1.5x cheap"), run("no_dimmer", "1.5x cheap")
    assert cheap["half_credit"] > alone["half_credit"] + 0.05 and cheap["refused"] < 0.05 < alone["refused"]
    # in batches as long as their longest answer a degraded one saves nothing: refuse instead, as
    # the throttle alone does, after the seconds that showed it
    batched, alone = run("slotune", "1.5x batched"), run("no_dimmer", "1.5x batched")
    assert batched["degraded"] < 0.15 and batched["half_credit"] > alone["half_credit"] - 0.05
    for scenario in ("0.8x cheap", "0.8x batched"):      # under capacity: nothing degraded; the throttle
        light = run("slotune", scenario)                  # refused 0.06 % after the 3 s P99 was over the SLO
        assert light["degraded"] == 0.0 and light["refused"] < 0.001, (scenario, light)
