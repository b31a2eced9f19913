"""Falling behind its arrivals: a service that answers fewer requests than arrive is
named, as `queueing` where it answers as many as ever (an overload), or as the stall
that slowed it where it answers fewer than it used to; what the measured causes
explain stays theirs."""
import numpy as np
import pytest

from slotune.attribution import explain as attribution
from slotune.attribution.explain import explain
from slotune.model.histogram import Histogram
from slotune.model.window import Window
from tests.test_attribution import SLOW_TAIL, per_event, window


def served(t, arrived=50, answered=50, tail_s=0.0, runqueue_s=0.0005) -> Window:
    """One second of an app the kernel times: `arrived` requests read, `answered` answered
    in ~13 ms, one in five of them tail_s later; runqueue_s of run-queue wait per request."""
    rng = np.random.default_rng(t)
    values = rng.lognormal(np.log(0.013), 0.1, answered) + np.where(np.arange(answered) % 5 == 0, tail_s, 0.0)
    timing = Histogram.from_values(list(values * 1e9))
    w = Window("app", t, t + 1.0, 0.5, latency=timing, latency_source="ebpf")
    w.histograms[("http_request", "")] = timing
    w.counters[("http_arrived", "")] = float(arrived)
    w.histograms[("runqueue_wait", "")] = per_event(runqueue_s * answered, answered)
    return w


CALM = [served(t) for t in range(40)]


def recent(**kw) -> list[Window]:
    return CALM + [served(t, **kw) for t in (40, 41)]


def test_a_service_answering_fewer_than_arrive_at_its_usual_pace_is_named_as_queueing():
    # 55 a second arrive (10 % more: no surge), 50 are answered as always, the tail grows
    # 400 ms and nothing the kernel measures rose: an overload.
    e = explain("app", {"app": recent(arrived=55, tail_s=0.4)})
    assert e.top_cause == attribution.QUEUEING and e.shares[attribution.QUEUEING] > 0.9
    assert e.evidence[attribution.QUEUEING].recent == pytest.approx(5.0)
    assert e.evidence[attribution.QUEUEING].baseline == pytest.approx(0.0)
    assert e.verdict.endswith("% queueing (55 arriving/s, 50 answered/s)")
    # The same tail from a service that keeps up with its arrivals: nothing to name.
    kept_up = explain("app", {"app": recent(tail_s=0.4)})
    assert kept_up.verdict.endswith("no dominant cause") and attribution.QUEUEING not in kept_up.evidence


def test_a_request_read_in_one_span_and_answered_in_the_next_is_no_queue():
    e = explain("app", {"app": recent(arrived=51, tail_s=0.4)})
    assert attribution.QUEUEING not in e.evidence and e.top_cause == ""


def test_a_stall_that_made_the_service_fall_behind_takes_its_queue():
    # CPU-starved: the run-queue wait rose 4.5 ms per request, the app answers 40 a second
    # of the 50 that arrive (it used to answer all 50), and the tail grew 400 ms. The queue
    # is the stall's doing: the growth is the run-queue wait's, not "queueing"'s.
    e = explain("app", {"app": recent(answered=40, tail_s=0.4, runqueue_s=0.005)})
    assert e.top_cause == "runqueue_wait" and e.shares["runqueue_wait"] > 0.9
    assert attribution.QUEUEING not in e.evidence
    assert e.verdict.endswith("runqueue_wait (50 arriving/s, 40 answered/s)")
    # Keeping up (40 arrive, 40 answered), the stall takes only its rise scaled up, the rest unexplained.
    kept_up = explain("app", {"app": recent(arrived=40, answered=40, tail_s=0.4, runqueue_s=0.005)})
    assert kept_up.shares["runqueue_wait"] < 0.2


def test_what_the_measured_causes_explain_stays_theirs_and_the_queue_takes_the_rest():
    # An overload (55 arrive, 50 answered as usual) in which the run-queue wait rose a little:
    # the stall keeps its rise scaled up TAIL_GAIN times, the queue takes what is left.
    e = explain("app", {"app": recent(arrived=55, tail_s=0.4, runqueue_s=0.002)})
    stall = e.evidence["runqueue_wait"]
    assert stall.rise_s > 0 and stall.credited_s == pytest.approx(attribution.TAIL_GAIN * stall.rise_s)
    assert e.top_cause == attribution.QUEUEING
    assert stall.credited_s + e.evidence[attribution.QUEUEING].credited_s == pytest.approx(e.moves[e.moved][2])
    assert e.confidence > 0.5


def test_a_service_timed_by_its_own_histogram_falls_behind_as_its_in_flight_gauge_rises():
    def counted(t, in_flight, counts):
        w = window(t, counts)       # 100 answered a second, counted by the service
        w.gauges[("app_inflight_requests", "")] = in_flight
        return w
    calm = [counted(t, 5.0, (0, 100, 0, 0, 0, 0, 0)) for t in range(40)]
    e = explain("svc", {"svc": calm + [counted(40, 15.0, SLOW_TAIL), counted(41, 25.0, SLOW_TAIL)]})
    assert e.top_cause == attribution.QUEUEING
    assert e.evidence[attribution.QUEUEING].recent == pytest.approx(10.0)
    assert e.verdict.endswith("queueing (110 arriving/s, 100 answered/s, 20 in flight)")
    steady = explain("svc", {"svc": calm + [counted(40, 5.0, SLOW_TAIL), counted(41, 5.0, SLOW_TAIL)]})
    assert attribution.QUEUEING not in steady.evidence
