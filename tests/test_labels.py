"""The label spelling is one-to-one: whatever values a service puts in its labels,
parse(key(labels)) gives them back, and no value can add or change another label."""
from hypothesis import given, settings, strategies as st

from slotune.model import labels

NAMES = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,8}", fullmatch=True).filter(lambda k: k != "le")


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(NAMES, st.text(max_size=20), max_size=5))
def test_parse_inverts_key_for_any_values(series):
    assert labels.parse(labels.key(series)) == series


def test_a_value_cannot_reclassify_a_request():
    spelled = labels.key({"outcome": "ok", "route": ",outcome=rejected"})
    assert labels.value(spelled, "outcome") == "ok"
    assert labels.value(spelled, "route") == ",outcome=rejected"
    assert labels.key({"a": "%2C"}) != labels.key({"a": ","})


def test_plain_values_keep_their_spelling():
    assert labels.key({"stage": "tools", "outcome": "ok", "le": "0.5"}) == "outcome=ok,stage=tools"
