"""The gateway's policies on their own, with time passed in: the circuit
breaker's window, threshold and half-open probe; the token bucket; the caches'
capacity and the vector cache's threshold; the settings' checks."""
from __future__ import annotations

import numpy as np
import pytest

from reference_stack.breaker import Breaker
from reference_stack.caches import LRUCache, VectorCache
from reference_stack.corpus import ENTITIES
from reference_stack.embedding import embed
from reference_stack.ratelimit import TokenBucket
from reference_stack.settings import Setting, SettingError, Settings


def test_breaker_needs_the_minimum_calls_and_a_ratio_above_threshold():
    b = Breaker(window=20, min_calls=5)
    for t in range(4):
        b.record(True, t, threshold=0.5)
    assert not b.is_open                          # 4 failures < 5 calls minimum
    b.record(True, 4, threshold=0.5)
    assert b.is_open and not b.allow(5.0, open_s=5)


def test_breaker_threshold_is_a_failure_ratio():
    for threshold, opens in ((0.59, True), (0.6, False), (1.0, False)):
        b = Breaker(window=10, min_calls=5)
        for failed in [True, False, True, False, True]:           # 3 of 5 = 0.6
            b.record(failed, 0.0, threshold)
        assert b.is_open is opens, threshold
    b = Breaker(window=5, min_calls=5)
    for failed in [True] * 2 + [False] * 5:
        b.record(failed, 0.0, 0.0)
    assert b.is_open          # it opened at the 5th call (2/5 > 0) and stays open until a probe


def test_breaker_opens_on_a_run_of_failures_when_asked():
    b = Breaker(window=20, min_calls=5)
    for failed in [False] * 10 + [True] * 3:
        b.record(failed, 0.0, threshold=0.9, consecutive=3)
    assert b.is_open                              # 3 in a row, though the ratio is only 3/13
    b = Breaker(window=20, min_calls=5)
    for failed in [False] * 10 + [True, True, False, True, True]:
        b.record(failed, 0.0, threshold=0.9, consecutive=3)
    assert not b.is_open                          # never 3 in a row; consecutive=0 would be off


def test_half_open_lets_one_probe_through_and_its_result_decides():
    b = Breaker(window=10, min_calls=1)
    b.record(True, 0.0, 0.5)
    assert not b.allow(4.9, open_s=5)
    assert b.allow(5.0, open_s=5) and not b.allow(5.1, open_s=5)      # one probe only
    b.record(True, 5.2, 0.5)                      # the probe failed: open again from now
    assert b.is_open and not b.allow(10.1, open_s=5) and b.allow(10.25, open_s=5)
    b.record(False, 10.3, 0.5)                    # the probe succeeded: closed, window cleared
    assert not b.is_open and b.allow(10.4, open_s=5)
    b.record(True, 10.5, 0.5)
    assert b.is_open                              # min_calls 1: one failure in a fresh window
    assert b.allow(11.5, open_s=1)                # open_s comes with each call: a change applies at once


def test_token_bucket_admits_the_rate_with_a_quarter_second_burst():
    bucket = TokenBucket()
    assert all(bucket.admit(0, t) for t in range(100))           # 0 = unlimited
    bucket = TokenBucket()
    admitted = sum(bucket.admit(100, i / 1000) for i in range(2000))   # 1000 arrivals/s for 2 s at 100/s
    assert admitted == pytest.approx(200, abs=26)                 # 2 s of tokens + at most the 25-token burst
    burst = TokenBucket()
    burst.admit(40, 0.0)
    assert sum(burst.admit(40, 10.0) for _ in range(30)) == 10    # after idling: 40/4 tokens, no more


def test_lru_keeps_the_most_recently_used():
    lru = LRUCache(capacity=3)
    for k in "abc":
        lru.put(k, k.upper())
    assert lru.get("a") == "A"
    lru.put("d", "D")                             # evicts b, the least recently used
    assert lru.get("b") is None and [lru.get(k) for k in "acd"] == ["A", "C", "D"]


def test_vector_cache_reuses_only_close_queries_and_forgets_the_oldest():
    cache = VectorCache(threshold=0.91, capacity=2)

    def v(q):
        return embed(q, ENTITIES)

    cache.put(v("what is the weather in Paris"), "paris")
    assert cache.get(v("What's the weather in paris?")) == "paris"
    assert cache.get(v("what is the weather in Berlin")) is None
    cache.put(v("search for jazz history"), "jazz")
    cache.put(v("what is 12 plus 30"), "42")
    assert cache.get(v("what is the weather in Paris")) is None    # overwritten in the ring
    assert cache.get(v("what is 12 plus 30")) == "42"
    assert cache.get(np.zeros(256, dtype=np.float32)) is None


def test_settings_are_all_or_nothing_and_typed():
    specs = [Setting("size", int, 1, 8, 4, ""), Setting("on", bool, 0, 1, False, ""),
             Setting("rate", float, 0, 1, 0.5, "")]
    s = Settings(specs, {"size": "6", "on": "true"})
    assert s.snapshot() == {"size": 6, "on": True, "rate": 0.5}
    with pytest.raises(SettingError, match=r"rate=2 is out of range; allowed range \[0, 1\]"):
        s.patch({"size": 2, "rate": 2})
    assert s["size"] == 6
    with pytest.raises(SettingError, match="on=1 is not a boolean"):
        s.patch({"on": 1})
    changes = []
    s.on_change(changes.append)
    assert s.patch({"rate": 1}) == {"size": 6, "on": True, "rate": 1.0} and changes == [{"rate": 1.0}]
    assert type(s["rate"]) is float and s.bounds() == {"size": [1, 8], "on": [False, True], "rate": [0.0, 1.0]}

