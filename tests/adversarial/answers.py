"""Hypothesis strategies for what a hostile service answers: arbitrary bytes, JSON of
odd shapes built from the keys the parsers look for, and a few known-bad bodies."""
from __future__ import annotations

import json

from hypothesis import settings
from hypothesis import strategies as st

FUZZ = settings(max_examples=150, deadline=2000)
KEYS = ("settings", "entries", "final_value", "name", "internal_states", "info", "success", "updated", "rate",
        "max_batch_size", "dynamic_batching", "max_queue_delay_microseconds", "max_running_requests",
        "max_parallel_requests", "rpm_limit", "status", "error", "data", "result", "metric", "values", "deploy_id")
LEAVES = (st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=4)
          | st.sampled_from(["m", "OK", "success", "100", "1e999", "NaN", "-1", 10**400, 2**63, -0.0]))
SHAPED = st.recursive(LEAVES, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=3), inner, max_size=4),
                      max_leaves=16).map(lambda value: json.dumps(value).encode())
KNOWN_BAD = st.sampled_from([b"[" * 100_000, b'{"a":' * 50_000, b'\\"' * 50_000, b"\xff\xfe", b"", b"OK",
                             b"1" + b"0" * 5000])
ANSWERS = st.binary(max_size=300) | SHAPED | KNOWN_BAD
