"""The dimmer in the real gateway over real HTTP (real tools, Redis and inference):
degrade_ratio answers exactly its share of the queries degraded, each a 200 with no
tool call and fewer tokens, counted by reason; the daemon's config takes the degrade
tuner for the gateway and its control loop pushes the ratio to the live service."""
from __future__ import annotations

import random

import numpy as np

from slotune import config
from slotune.actuators import for_control
from slotune.store.audit import AuditLog, Outcome
from slotune.control.loop import ControlLoop
from slotune.model.histogram import Histogram
from slotune.model.interval import Interval
from slotune.model.window import Window
from reference_stack.corpus import tool_queries

QUERIES = 40
FULL_TOKENS = 4          # the test stack's --max-new-tokens (launcher.SMALL_MODEL)


def tool_calls(stack) -> float:
    return sum(stack.metric("gateway", "gateway_tool_calls_total", tool=t, outcome=o)
               for t in ("search", "calculator", "weather") for o in ("ok", "error", "timeout", "rejected"))


def test_degrade_ratio_half_answers_exactly_half_degraded_each_a_200_without_tool_calls(stack):
    queries = tool_queries(random.Random(18), QUERIES)     # distinct: each a cache miss after the flush
    dimmed = stack.metric("gateway", "gateway_degraded_total", reason="dimmer")
    tokens = stack.metric("inference", "inference_tokens_total")
    stack.admin("gateway", "POST", {"level": "all"}, path="/admin/cache/flush")
    stack.patch("gateway", degrade_ratio=0.5, degrade_max_tokens=1, intent_threshold=0.0)   # every query wants tools
    try:
        answers = []
        for q in queries:
            calls = tool_calls(stack)
            status, body = stack.query(q)
            assert status == 200, body
            answers.append((body, tool_calls(stack) - calls))
    finally:
        stack.patch("gateway", degrade_ratio=0.0, degrade_max_tokens=4, intent_threshold=0.82)
    degraded = [(body, made) for body, made in answers if body["degraded"]]
    assert len(degraded) == QUERIES // 2
    assert all(body["tools"] == [] and made == 0 for body, made in degraded), degraded
    assert all(body["tools"] and made > 0 for body, made in answers if not body["degraded"])
    assert stack.metric("gateway", "gateway_degraded_total", reason="dimmer") == dimmed + QUERIES // 2
    assert stack.metric("inference", "inference_tokens_total") == tokens + QUERIES // 2 * (FULL_TOKENS + 1)


def test_degrade_ratio_is_a_live_setting_with_its_range(stack):
    status, body = stack.admin("gateway")
    assert status == 200 and body["bounds"]["degrade_ratio"] == [0.0, 1.0] and body["settings"]["degrade_ratio"] == 0
    status, body = stack.admin("gateway", "PATCH", {"degrade_ratio": 1.5})
    assert status == 400 and "degrade_ratio=1.5 is out of range; allowed range [0, 1]" in body["error"], body


def test_the_config_takes_the_degrade_tuner_and_the_loop_pushes_the_ratio_to_the_live_gateway(stack, tmp_path):
    path = tmp_path / "slotune.toml"
    path.write_text(f"""
[services.gateway]
cmdline = "reference_stack gateway"
slo_p99_ms = 800
[services.gateway.control]
kind = "reference"
url = "{stack.urls['gateway']}/admin/config"
token_file = "{stack.state['token_file']}"
[services.gateway.tuners.degrade]
policy = "whitepaper"
interval_s = 1.0
[services.gateway.settings.degrade_ratio]
min = 0.0
max = 1.0
max_step = 0.5
""")
    cfg = config.load(path)
    [tuner] = cfg.service("gateway").tuners
    assert (tuner.name, tuner.policy, tuner.interval_s) == ("degrade", "whitepaper", 1.0)
    control = ControlLoop(cfg, {"gateway": for_control(cfg.service("gateway").control)}, AuditLog(None), False)
    slow = Histogram.from_values(np.full(50, 1.2e9))          # P99 1.2 s, over the 800 ms SLO
    try:
        entries = [e for t in (1.0, 2.0, 3.0)
                   for e in control.tick(Interval.at(t, {"gateway": [Window("gateway", t - 1, t, 0.8, latency=slow,
                                                                           latency_source="service")]}))]
        assert [(e.setting, e.outcome, e.old, e.new) for e in entries] == [
            ("degrade_ratio", Outcome.PUSHED, 0.0, 0.5)]             # 3rd period over: all, within max_step
        assert stack.settings("gateway")["degrade_ratio"] == 0.5
    finally:
        stack.patch("gateway", degrade_ratio=0.0)
