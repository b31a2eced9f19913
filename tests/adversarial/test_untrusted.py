"""json_value, the one way a service's JSON is read: whatever the bytes, a value or
Untrusted comes out (never RecursionError, UnicodeDecodeError or a hang), in time
linear in the input, and valid JSON within the budget reads as json.loads reads it."""
from __future__ import annotations

import json
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slotune.host.untrusted import MAX_DEPTH, Untrusted, depth, json_value
from tests.adversarial.answers import FUZZ

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
                    max_leaves=20)


def nested(levels: int, leaf: object = 1) -> object:
    for i in range(levels):
        leaf = [leaf] if i % 2 else {"k": leaf}
    return leaf


@pytest.mark.parametrize("data", [b"[" * 100_000, b'{"a":' * 50_000, json.dumps(nested(MAX_DEPTH + 1)).encode()],
                         ids=["100000-brackets", "50000-open-objects", "one-level-too-deep"])
def test_json_nested_too_deep_is_untrusted_not_a_recursion_error(data):
    with pytest.raises(Untrusted, match="GET /x is nested deeper than 64 levels"):
        json_value(data, "GET /x")


def test_json_at_the_depth_limit_reads():
    value = nested(MAX_DEPTH)
    assert json_value(json.dumps(value), "x") == value


@pytest.mark.parametrize("data, words", [
    (b"[" + b"0," * 3000 + b"0]", "is 6003 bytes, more than the 5000 read"),
    (b"\xff\xfe{}", "is not JSON"),
    (b'{"a": 1', "is not JSON"),
    (b"9" * 4301, "is not JSON"),                 # past Python's 4300 digits for an int
    ("\ud800", "is not JSON"),                    # a lone surrogate in text
], ids=["over-the-cap", "not-utf-8", "cut-short", "a-4301-digit-integer", "lone-surrogate"])
def test_what_is_not_json_within_the_budget_is_untrusted(data, words):
    with pytest.raises(Untrusted, match=f"answer {words}"):
        json_value(data, "answer", 5000)


@pytest.mark.parametrize("data", [b'\\"' * 200_000, b'"' + b"\\" * 400_000, b'"\\"' * 130_000],
                         ids=["escaped-quotes-outside-a-string", "an-unclosed-string-of-backslashes",
                              "unclosed-strings-each-escaping-its-end"])
@pytest.mark.timeout(30)
def test_the_depth_scan_is_linear_on_quotes_and_backslashes(data):
    """A scan that tried each quote as a string's start would run to the end from each: minutes for 400 kB."""
    start = time.monotonic()
    with pytest.raises(Untrusted):
        json_value(data, "x")
    assert time.monotonic() - start < 0.5


@pytest.mark.parametrize("raw, levels", [
    (b'["[[[", {"a": [1]}]', 3), (b"", 0), (b"]]][", 0), (b'"\\"[[', 0), (b'"\\\\"[[', 2), (b'{"}": [{}]}', 3),
], ids=["brackets-in-a-string", "empty", "closed-first", "unclosed-string", "closed-by-an-escaped-backslash",
        "a-closing-brace-in-a-key"])
def test_depth_counts_brackets_outside_strings(raw, levels):
    assert depth(raw) == levels


@FUZZ
@given(st.binary(max_size=400) | st.text(max_size=200))
def test_any_bytes_give_a_value_or_untrusted(data):
    try:
        json_value(data, "x", max_bytes=300, max_depth=8)
    except Untrusted:
        pass


@FUZZ
@given(JSON)
def test_json_within_the_budget_reads_as_json_loads_reads_it(value):
    text = json.dumps(value)
    assert json.dumps(json_value(text, "x")) == json.dumps(json.loads(text))


def nesting(value: object) -> int:
    if isinstance(value, (list, dict)):
        return 1 + max(map(nesting, value.values() if isinstance(value, dict) else value), default=0)
    return 0


@FUZZ
@given(JSON)
def test_depth_is_the_nesting_of_any_json(value):
    assert depth(json.dumps(value).encode()) == nesting(value)
