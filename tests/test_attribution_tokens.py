"""TTFT and TPOT attribution pinned on windows built by hand: which token cause
(waiting sequences, prefill per step, batch width, preemptions) a growth is
credited to, the verdict naming the signal that moved, and /status's shape."""
import json
import math

import numpy as np
import pytest

from slotune.attribution import causes
from slotune.attribution.explain import explain
from slotune.model.histogram import BucketHistogram
from slotune.model.window import Window

SLO_TTFT_S, SLO_TPOT_S = 0.5, 0.05


def at(value: float, n: float = 20) -> BucketHistogram:
    """n observations of about `value` (all in the bucket whose top is value)."""
    return BucketHistogram((value * 0.999, value, math.inf), np.array([0.0, float(n), 0.0]), n * value)


def llm_window(t, ttft_ms=50.0, tpot_ms=15.0, waiting=1.0, running=4.0, tokens=5.0, preemptions=0.0,
               first_tokens=10, slo=True) -> Window:
    """One second of a continuous-batching server: `first_tokens` requests got their first
    token, `tokens` tokens and `running` sequences per step (100 steps), gauges as given."""
    hist = {("inference_iteration_tokens", ""): at(tokens, 100), ("inference_iteration_sequences", ""): at(running, 100)}
    return Window("inference", t, t + 1.0, 2.0, latency=at(1.0, first_tokens), latency_source="service", histograms=hist,
                  counters={("inference_num_preemptions_total", ""): preemptions},
                  gauges={("inference_num_requests_waiting", ""): waiting,
                          ("inference_num_requests_running", ""): running},
                  slo_ttft_s=SLO_TTFT_S if slo else 0.0, slo_tpot_s=SLO_TPOT_S if slo else 0.0,
                  ttft=at(ttft_ms / 1e3, first_tokens), tpot=at(tpot_ms / 1e3, 100 * running))


def run(recent: dict, n_calm: int = 20, **calm) -> dict:
    ws = [llm_window(t, **calm) for t in range(n_calm)] + [llm_window(n_calm + i, **recent) for i in range(2)]
    return explain("inference", {"inference": ws}, recent_s=2.0)


def test_a_load_step_that_fills_the_queue_is_credited_to_waiting_sequences():
    e = run({"ttft_ms": 230.0, "waiting": 52.0}, waiting=14.0)
    ttft = e.tokens["ttft"]
    assert ttft.what == "TTFT" and ttft.moved == "P99"
    assert ttft.growth_s == pytest.approx(0.18, rel=0.01)
    assert ttft.top_cause == "queue"
    # Little's law with 10 first tokens a second: 14 -> 1.4 s of waiting, 52 -> 5.2 s.
    assert ttft.evidence["queue"].baseline == 14.0 and ttft.evidence["queue"].recent == 52.0
    assert ttft.evidence["queue"].rise_s == pytest.approx(5.2 - 1.4)
    assert ttft.shares["queue"] > 0.9                       # nothing else moved
    assert ttft.verdict.startswith("inference TTFT P99 +180")
    assert "% queue (waiting 14 → 52)" in ttft.verdict
    assert e.tokens["tpot"].top_cause == ""                 # the steps did not slow


def test_queue_reads_waiting_over_the_rate_requests_leave_the_queue():
    w = llm_window(0, waiting=6.0, first_tokens=12)
    r = causes.queue(w)
    assert r.value_s == pytest.approx(0.5) and r.raw == 6.0 and r.short == "waiting"


def test_a_wider_batch_slows_every_step_and_tpot_names_batch_width():
    e = run({"tpot_ms": 45.0, "running": 16.0, "tokens": 17.0})
    tpot = e.tokens["tpot"]
    assert tpot.top_cause == "batch_width"
    assert "running 4 → 16" in tpot.verdict
    # each step's time split by tokens: 4 of 5 tokens are decodes in the baseline, 16 of 17 now
    assert tpot.evidence["batch_width"].rise_s == pytest.approx(0.045 * 16 / 17 - 0.015 * 4 / 5, rel=1e-3)


def test_long_prompts_chunked_beside_the_decodes_are_prefill_for_tpot_and_ttft():
    e = run({"tpot_ms": 45.0, "tokens": 64.0, "ttft_ms": 200.0})
    tpot, ttft = e.tokens["tpot"], e.tokens["ttft"]
    assert tpot.top_cause == "prefill" and ttft.top_cause == "prefill"
    assert "prefill tokens/step 1 → 60" in tpot.verdict
    assert tpot.evidence["prefill"].rise_s == pytest.approx(0.045 * 60 / 64 - 0.015 * 1 / 5, rel=1e-3)
    assert tpot.shares["prefill"] > tpot.shares.get("batch_width", 0.0)


def test_preemptions_explain_a_ttft_growth_when_the_cache_runs_out():
    e = run({"ttft_ms": 300.0, "preemptions": 15.0})
    ttft = e.tokens["ttft"]
    assert ttft.top_cause == "preemption"
    assert ttft.evidence["preemption"].recent == pytest.approx(1.5)       # 15 over 10 requests
    assert "preemptions/request 0 → 1.5" in ttft.verdict


def test_a_steady_server_has_no_dominant_token_cause():
    e = run({})
    assert e.tokens["ttft"].top_cause == "" and e.tokens["tpot"].top_cause == ""
    assert e.tokens["ttft"].verdict.endswith("+0.0 ms over its baseline: no dominant cause")


def test_tokens_are_explained_only_for_a_service_that_declares_their_objectives():
    assert run({"ttft_ms": 230.0, "waiting": 52.0, "slo": False}, slo=False).tokens == {}


def test_too_few_windows_warm_up_per_token_timing():
    ws = [llm_window(t) for t in range(3)]
    e = explain("inference", {"inference": ws}, recent_s=2.0)
    assert e.tokens["ttft"].verdict.startswith("inference TTFT: warming up")


def test_status_carries_the_token_explanations_as_json():
    status = run({"ttft_ms": 230.0, "waiting": 52.0}, waiting=14.0).as_status()
    ttft = json.loads(json.dumps(status))["tokens"]["ttft"]
    assert ttft["top_cause"] == "queue" and ttft["p99_s"] == pytest.approx(0.23, rel=0.01)
    assert ttft["evidence"]["queue"]["short"] == "waiting"
    assert "tokens" not in status["tokens"]["ttft"]


def test_slotune_status_prints_what_moved_ttft_and_tpot():
    from slotune.export.status_table import render
    attribution = run({"ttft_ms": 230.0, "waiting": 52.0}, waiting=14.0).as_status()
    row = {"p50_s": 1.0, "p99_s": 2.0, "slo_p99_s": 30.0, "rate_rps": 10.0, "settings": {},
           "control_reachable": True, "attribution": attribution}
    table = render({"services": {"inference": row}, "decisions": []})
    lines = table.splitlines()
    head = lines.index("token attribution (TTFT, TPOT):")
    assert "inference TTFT P99 +180" in lines[head + 1] and "queue (waiting 14 → 52)" in lines[head + 1]
    assert lines[head + 2].startswith("  inference TPOT")


def test_no_first_token_lately_is_said_with_the_waiting_line_not_as_warming_up():
    ws = [llm_window(t) for t in range(20)]
    ws += [llm_window(20 + i, waiting=47.0, first_tokens=0) for i in range(3)]
    e = explain("inference", {"inference": ws}, recent_s=2.0)
    assert e.tokens["ttft"].verdict == "inference TTFT: no request timed in the last 2 s (47 waiting)"
