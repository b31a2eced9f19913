"""Budget split pinned on hand-computed cases, plus the closed-loop mismatched-SLO test."""
import math

import numpy as np
import pytest

from bench.sim import budget_bench
from tests.tuners.purity import assert_pure
from slotune.tuners import budget

P = budget.POLICIES
HOPS = (("gateway", 0.1), ("tool", 0.3), ("inference", 0.6))
START = {budget.PREFIX + h: 1 / 3 for h, _ in HOPS}


def obs(p50=(), p99=(), slos=HOPS):
    return budget.Observation(now=10.0, slo_s=1.0, hop_slos_s=slos, hop_p50_s=p50, hop_p99_s=p99)


def test_whitepaper_weights_are_the_slo_shares():
    _, d = P["whitepaper"].decide(P["whitepaper"].initial_state(START), obs(slos=(("a", 20), ("b", 60), ("c", 20))))
    assert d.changes == {"budget_weight.a": 0.2, "budget_weight.b": 0.6, "budget_weight.c": 0.2}


def test_equal_split():
    _, d = P["equal"].decide(P["equal"].initial_state({}), obs())
    assert all(math.isclose(w, 1 / 3) for w in d.changes.values()) and len(d.changes) == 3


def test_least_miss_is_symmetric_and_favours_the_slow_hop():
    same = budget.least_miss_weights(1.0, {"a": (0.1, 0.3), "b": (0.1, 0.3)})
    assert math.isclose(same["a"], 0.5) and math.isclose(same["b"], 0.5)
    w = budget.least_miss_weights(1.0, {"fast": (0.05, 0.1), "slow": (0.2, 0.6)})
    assert w["slow"] > 0.6 and math.isclose(sum(w.values()), 1.0)


def test_slotune_starts_on_the_slo_split_then_jumps_to_the_fit():
    sl = P["slotune"]
    s, d = sl.decide(sl.initial_state(START), obs(p50=(("gateway", 0.03),), p99=(("gateway", 0.06),)))
    assert math.isclose(d.changes["budget_weight.tool"], 0.3) and not s.learned
    fits = (("gateway", 0.1), ("tool", 0.1), ("inference", 0.1))
    s, d = sl.decide(s, obs(p50=fits, p99=tuple((h, 0.3) for h, _ in fits)))
    assert s.learned and all(math.isclose(w, 1 / 3) for w in s.weights.values())
    s, d = sl.decide(s, obs(p50=(("gateway", 0.03),), p99=(("gateway", 0.06),)))
    assert d.changes == {}                                   # a hop without data: weights held


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match=r"budget_weight.tool = 1.5 is outside 0..1"):
        P["slotune"].initial_state({"budget_weight.tool": 1.5})
    with pytest.raises(ValueError, match=r"give each hop a positive SLO"):
        P["whitepaper"].decide({}, obs(slos=(("a", 0.0), ("b", 0.0))))


def test_policies_are_pure():
    seq = [obs(p50=tuple((h, 0.01 * k * (i + 1)) for i, (h, _) in enumerate(HOPS)),
               p99=tuple((h, 0.03 * k * (i + 1)) for i, (h, _) in enumerate(HOPS))) for k in range(1, 6)]
    assert_pure(P, START, seq)


def test_slotune_beats_hand_written_hop_slos():
    good = {p: np.median([budget_bench.run_one(p, "mismatched", seed, quick=True)["goodput_ratio"] for seed in (1, 2)])
            for p in ("slotune", "whitepaper")}
    assert good["slotune"] > good["whitepaper"] + 0.1
