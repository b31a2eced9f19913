"""What the daemon hands the batch tuner: the batches each window ran, one group
per window, so the tuner can fit batch time against size and see its scatter;
what it hands the budget tuner: each hop's P50 and P99 from the stage timings;
the queueing the throttle reads (P99 over the lowest P99 of the history),
each second from only the windows added since the last; and whether degrading
pays, which the dimmer and the throttle read alike."""
import math
import random
from dataclasses import replace

import numpy as np
import pytest

from slotune.config import ServiceConf, TunerConf
from slotune.control import observations
from slotune.control.observations import MIN_REQUESTS, Inputs, queue_p99
from slotune.control.tuner_specs import SPECS
from slotune.model.histogram import BucketHistogram, Histogram
from slotune.model.interval import Span
from slotune.model.service import ServiceSpec
from slotune.model.window import Window
from slotune.tuners import batch, budget, degrade, throttle


def counts(bounds, values) -> BucketHistogram:
    bounds = (*bounds, math.inf)
    c = np.zeros(len(bounds))
    for v in values:
        c[next(i for i, b in enumerate(bounds) if v <= b)] += 1
    return BucketHistogram(bounds, c, float(sum(values)))


def window(t, sizes, compute_s) -> Window:
    w = Window("inference", t, t + 1, 0.5)
    if sizes:
        w.histograms[("inference_batch_size", "")] = counts((1, 2, 4, 8, 16, 32), sizes)
        w.histograms[("inference_batch_compute_seconds", "")] = counts((0.01, 0.05, 0.1), compute_s)
    return w


def test_each_window_with_batches_is_one_group_of_its_mean_size_count_and_mean_time():
    ws = [window(0, [8, 8, 16], [0.03, 0.03, 0.06]), window(1, [], []), window(2, [2, 4], [0.01, 0.02])]
    conf = ServiceConf(ServiceSpec("inference", cmdline="inference", slo_p99_s=0.5))
    assert batch.batches_run(Inputs(3.0, ws, ws, conf, {}, 3.0, lambda *_: None)) == ((11, 3, 0.04), (3, 2, 0.015))


def stage_window(t, stages_ms: dict[str, list[float]]) -> Window:
    w = Window("gateway", t, t + 1, 0.8)
    for stage, values in stages_ms.items():
        w.histograms[("gateway_stage_duration_seconds", f"stage={stage}")] = Histogram.from_values(
            [v * 1e6 for v in values])
    return w


def p99_of(values_ms) -> float:
    return Histogram.from_values([v * 1e6 for v in values_ms]).quantile(0.99)


def budget_inputs(windows) -> Inputs:
    conf = ServiceConf(ServiceSpec("gateway", cmdline="gateway", slo_p99_s=0.8))
    return Inputs(10.0, windows, windows, conf, SPECS["budget"].option_values({"tool_slo_ms": 250.0}), 10.0,
                  lambda *_: None)


def test_budget_hops_are_the_tool_and_llm_stages_and_the_rest_is_the_gateway_s_own_work():
    ms = np.linspace(0.5, 1.5, 101)        # P50 at 1x, P99 near 1.5x
    windows = [stage_window(0, {"gate": 2 * ms, "cache": 3 * ms, "tools": 100 * ms}),
               stage_window(1, {"gate": 2 * ms, "llm": 300 * ms})]
    obs = budget.observe(budget_inputs(windows))
    assert [hop for hop, _ in obs.hop_slos_s] == ["gateway", "tool", "llm"]
    assert dict(obs.hop_slos_s) == pytest.approx({"gateway": 0.1, "tool": 0.25, "llm": 0.6})
    p50, p99 = dict(obs.hop_p50_s), dict(obs.hop_p99_s)
    assert p50 == pytest.approx({"gateway": 0.005, "tool": 0.1, "llm": 0.3}, rel=0.1)
    assert p99["gateway"] == pytest.approx(p99_of(2 * ms) + p99_of(3 * ms), rel=0.01)   # the stages' sum
    assert p99["tool"] == pytest.approx(0.15, rel=0.1) and obs.slo_s == 0.8


def test_a_hop_without_calls_reads_zero_so_the_budget_tuner_waits_for_its_data():
    obs = budget.observe(budget_inputs([stage_window(0, {"gate": [2.0, 2.0], "llm": [300.0, 320.0]})]))
    assert dict(obs.hop_p50_s)["tool"] == 0.0 and dict(obs.hop_p99_s)["tool"] == 0.0


def test_queue_p99_slides_with_the_history_reading_only_the_windows_added_since(monkeypatch):
    rng = random.Random(3)

    def latency_window(t) -> Window:
        n = rng.choice([0, 2, MIN_REQUESTS, 40])          # some too few to say a tail
        w = Window("gateway", t, t + 1, 0.8)
        if n:
            w = Window("gateway", t, t + 1, 0.8, latency=Histogram.from_values(
                [rng.uniform(1e6, 5e6) * rng.choice([1, 1, 4]) for _ in range(n)]))
        return w

    def expected(history, merged) -> float:
        tails = [w.p(0.99) for w in history if w.requests >= MIN_REQUESTS]
        return max(0.0, merged.quantile(0.99) - min(tails)) if tails else 0.0

    ws = [latency_window(float(t)) for t in range(80)]
    merged = Histogram.from_values([3e6] * 50 + [9e6])
    reads = []
    real = observations._tail
    monkeypatch.setattr(observations, "_tail", lambda w: reads.append(w) or real(w))
    for end in range(10, 80):
        history = ws[max(0, end - 30):end]
        reads.clear()
        assert queue_p99(history[-2:], history, merged) == expected(history, merged)
        assert len(reads) == (len(history) if end == 10 else 1)
        assert queue_p99(history[-2:], history, merged) == expected(history, merged)   # the degrade tuner's, same tick
    assert queue_p99([], [], merged) == 0.0
    replaced = ws[52:70] + [latency_window(70.0)] + ws[71:80]    # a window in it replaced: read afresh
    reads.clear()
    assert queue_p99(replaced[-2:], replaced, merged) == expected(replaced, merged)
    assert len(reads) == len(replaced)


def dimmer_window(t, answered, degraded, queue_ms, refused=0.0) -> Window:
    """A gateway window: answered queries (degraded of them labelled so), each timed 100 ms
    plus its wait; the service's own queue-wait histogram says the wait."""
    lat = Histogram.from_values([(100 + queue_ms) * 1e6] * answered)
    w = Window("gateway", t, t + 1, 0.8, latency=lat, latency_source="service", rejected=refused)
    w.histograms[("gateway_request_duration_seconds", "outcome=degraded")] = Histogram.from_values(
        [(100 + queue_ms) * 1e6] * degraded)
    w.histograms[("gateway_queue_wait_seconds", "")] = Histogram.from_values([queue_ms * 1e6] * answered)
    return w


def test_the_dimmer_s_verdict_from_the_windows_the_throttle_and_the_dimmer_read_alike():
    conf = ServiceConf(ServiceSpec("gateway", cmdline="gateway", slo_p99_s=0.8,
                                   latency_metric="gateway_request_duration_seconds"))

    def inputs(history, worth=None):
        tuners = (TunerConf("throttle", "slotune", 1.0),
                  TunerConf("degrade", "slotune", 1.0, {} if worth is None else {"degraded_worth": worth}))
        c = replace(conf, tuners=tuners)
        return Inputs(history[-1].end, history[-1:], history, c, {}, 1.0, lambda *_: None,
                      settings={"degrade_ratio": 0.5}, running=frozenset({"throttle", "degrade"}))
    # two busy seconds in a row of full answers alone (600 ms queued, over the dimmer's ~480 ms budget):
    # 100 a second is what they carry; then 3 seconds degrading 60 of 110 within budget (the first settles)
    busy = [dimmer_window(float(t), 100, 0, 600.0, refused=20.0) for t in range(3)]
    mixed = [dimmer_window(float(t), 110, 60, 50.0) for t in range(3, 6)]
    v = degrade.observe(inputs(busy + mixed)).verdict
    assert (v.mixed, v.full_rps, v.worth_rps) == (False, 100.0, 80.0)    # 110 - 0.5 x 60
    # degrading everything would carry at most 0.5 x the 110 offered: nothing left to try, the throttle refuses
    assert not throttle.observe(inputs(busy + mixed)).degrade_room
    v = degrade.observe(inputs(busy + mixed, worth=0.9)).verdict
    assert (v.pays, v.worth_rps) == (True, 104.0)                        # worth 0.9 each: 110 - 0.1 x 60
    assert throttle.observe(inputs(busy + mixed, worth=0.9)).degrade_room
    v = degrade.observe(inputs(busy + mixed[:2])).verdict
    assert (v.pays, v.mixed, v.full_rps) == (None, None, 100.0)          # 2 degrading: not yet
    assert throttle.observe(inputs(busy + mixed[:2])).degrade_room
    # everything degraded, 150 answered, 75 worth/s: that does not pay either
    whole = [dimmer_window(float(t), 150, 150, 50.0) for t in range(6, 9)]
    v = degrade.observe(inputs(busy + mixed + whole)).verdict
    assert (v.pays, v.mixed, v.whole) == (False, False, False)


def ttft_window(service: str, t: float, ttft_ms: list[float]) -> Window:
    return Window(service, t, t + 1, 5.0, slo_ttft_s=1.0,
                  ttft=Histogram.from_values([v * 1e6 for v in ttft_ms]) if ttft_ms else None)


def test_a_service_throttled_at_a_proxy_is_steered_on_the_proxys_first_byte():
    """The proxy's clock starts before the engine's read: what waited unread in the engine's
    socket is in the proxy's TTFT only, so the throttle reads the proxy's where it has one."""
    conf = ServiceConf(ServiceSpec("vllm", port=8000, slo_p99_s=5.0, slo_ttft_p99_s=1.0), admission_by="front")
    own = [ttft_window("vllm", t, [300.0] * 50) for t in range(3)]
    front = [ttft_window("front", t, [300.0] * 40 + [2500.0] * 10) for t in range(3)]

    def p99(at_proxy) -> float:
        return throttle.observe(Inputs(3.0, own, own, conf, {}, 1.0, lambda *_: None,
                                       admission_span=at_proxy)).p99_s

    assert p99(None) == pytest.approx(0.3, rel=0.05)
    assert p99(Span(tuple(front))) == pytest.approx(2.5, rel=0.1)      # within one kernel slot
    untimed = [ttft_window("front", t, []) for t in range(3)]
    assert p99(Span(tuple(untimed))) == pytest.approx(0.3, rel=0.05), "a proxy with no timing: the service's own"
