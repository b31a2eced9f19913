"""The tuner registry the daemon relies on: TUNERS, policy(), every module's contract, purity."""
import dataclasses

import pytest

from slotune.tuners import TUNERS, policy
from slotune.tuners.base import Decision

EXPECTED = {
    "throttle": {"slotune", "whitepaper", "aimd", "gradient2", "vegas", "envoy"},
    "batch": {"slotune", "whitepaper", "clipper_aimd", "triton"},
    "sampling": {"slotune", "whitepaper", "jaeger"},
    "breaker": {"slotune", "whitepaper", "pybreaker", "resilience4j"},
    "drift": {"slotune", "whitepaper", "zscore", "cusum", "page_hinkley", "ks"},
    "budget": {"slotune", "whitepaper", "equal"},
    "degrade": {"slotune", "whitepaper", "brownout"},
    "continuous_batch": {"slotune", "whitepaper"},
}


def test_every_tuner_offers_slotune_whitepaper_and_its_anchors():
    assert set(TUNERS) == set(EXPECTED)
    for name, module in TUNERS.items():
        assert set(module.POLICIES) == EXPECTED[name]
        assert module.INTERVAL_S > 0
        assert all(p.name == key for key, p in module.POLICIES.items())
        assert dataclasses.is_dataclass(module.Observation)
        assert "now" in {f.name for f in dataclasses.fields(module.Observation)}


def test_policy_defaults_to_slotune():
    assert policy("batch") is TUNERS["batch"].POLICIES["slotune"]
    assert policy("drift", "cusum") is TUNERS["drift"].POLICIES["cusum"]


def test_unknown_tuner_is_named_with_the_valid_ones():
    with pytest.raises(ValueError, match=r"unknown tuner 'thrttle'.*batch, breaker, budget, continuous_batch, degrade, drift, sampling, throttle"):
        policy("thrttle")


def test_unknown_policy_is_named_with_the_valid_ones():
    with pytest.raises(ValueError, match=r"unknown policy 'pid' for tuner 'throttle'.*slotune, whitepaper, aimd, gradient2"):
        policy("throttle", "pid")


def test_missing_setting_is_named():
    with pytest.raises(ValueError, match=r"throttle tuner needs the current value of setting 'concurrency_limit'"):
        policy("throttle").initial_state({"rate_limit_rps": 10})


def test_decision_is_immutable():
    d = Decision({"x": 1.0}, "why")
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.reason = "other"
