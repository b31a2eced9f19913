"""The open-loop load generator: its arrival schedules (rates, profiles,
burstiness), its query mix, and a real run against the stack with its CSV."""
from __future__ import annotations

import csv
import math

import numpy as np
import pytest

from reference_stack.corpus import CHITCHAT, QueryStream
from reference_stack.loadgen import PROFILES, run_load, schedule, summarize, write_csv


@pytest.mark.parametrize("profile", PROFILES)
def test_every_profile_offers_the_mean_rate(profile):
    times = schedule(50, 60, profile, seed=3)
    assert len(times) == pytest.approx(3000, rel=0.08)
    assert np.all(np.diff(times) >= 0) and 0 <= times[0] and times[-1] <= 60


def test_profiles_shape_the_rate_over_time():
    halves = lambda t: (np.sum(t < 30), np.sum(t >= 30))
    first, second = halves(schedule(50, 60, "step", seed=4))
    assert second / first == pytest.approx(3.0, rel=0.15)           # rate/2 then 3·rate/2
    first, second = halves(schedule(50, 60, "ramp", seed=4))
    assert second / first == pytest.approx(3.0, rel=0.15)           # 0 -> 2·rate: a quarter, then three quarters
    diurnal = schedule(50, 60, "diurnal", seed=4)
    assert np.sum(diurnal < 30) > 2 * np.sum(diurnal >= 30)          # day, then night


def test_gamma_arrivals_are_burstier_than_poisson():
    cv = lambda t: float(np.std(np.diff(t)) / np.mean(np.diff(t)))
    assert cv(schedule(100, 60, "constant", "poisson", seed=5)) == pytest.approx(1.0, abs=0.1)
    assert cv(schedule(100, 60, "constant", "gamma", burstiness=0.25, seed=5)) == pytest.approx(2.0, rel=0.2)


def test_bad_parameters_are_named():
    with pytest.raises(ValueError, match="unknown profile 'sawtooth'; choose one of constant"):
        schedule(10, 10, "sawtooth")
    with pytest.raises(ValueError, match="rate"):
        schedule(0, 10)


def test_the_query_mix_repeats_rewords_and_chats():
    stream = QueryStream(seed=9)
    queries = [stream.next() for _ in range(2000)]
    distinct = set(queries)
    assert len(distinct) < len(queries) / 2                          # popular queries repeat
    assert any(q.startswith(("please ", "hey, ")) for q in distinct)  # some are reworded
    assert 0.05 < sum(q in CHITCHAT for q in queries) / len(queries) < 0.5


def test_open_loop_run_against_the_stack(stack, tmp_path):
    records = run_load(stack.state["query_url"], rate=15, duration_s=3, seed=2)
    summary = summarize(records, 3)
    assert len(records) == len(schedule(15, 3, seed=2))             # every scheduled arrival is recorded
    assert summary["outcomes"].get("ok", 0) + summary["outcomes"].get("degraded", 0) == len(records)
    assert summary["p50_s"] <= summary["p95_s"] <= summary["p99_s"] and not math.isnan(summary["p99_s"])
    assert sum(summary["cache"].values()) > 0
    path = tmp_path / "load.csv"
    write_csv(records, path)
    rows = list(csv.DictReader(path.open()))
    assert len(rows) == len(records) and {"t_s", "latency_s", "status", "outcome", "cache"} <= set(rows[0])


def test_overflow_beyond_max_inflight_counts_as_errors(stack):
    before = stack.settings("inference")
    stack.patch("inference", max_batch_size=1, max_queue_delay_ms=0)
    try:
        records = run_load(stack.state["query_url"], rate=200, duration_s=1, max_inflight=2, seed=6)
    finally:
        stack.patch("inference", **before)
    summary = summarize(records, 1)
    assert summary["overflow"] > 0 and summary["errors"] >= summary["overflow"]
