"""The open-loop load generator: its arrival schedules (rates, profiles,
burstiness), its query mix, and a real run against the stack with its CSV;
the LLM workload's lengths, and its streaming clients' own timing against the
LLM-mode server's metrics."""
from __future__ import annotations

import csv
import math

import numpy as np
import pytest

from reference_stack.corpus import CHITCHAT, QueryStream
from reference_stack.llm.load import Lengths, prompt_text, run_llm_load, summarize_llm
from reference_stack.loadgen import PROFILES, run_load, schedule, summarize, write_csv

from .test_llm_server import llm  # noqa: F401  (the LLM-mode server, one per module)


@pytest.mark.parametrize("profile", PROFILES)
def test_every_profile_offers_the_mean_rate(profile):
    times = schedule(50, 60, profile, seed=3)
    assert len(times) == pytest.approx(3000, rel=0.08)
    assert np.all(np.diff(times) >= 0) and 0 <= times[0] and times[-1] <= 60


def test_profiles_shape_the_rate_over_time():
    def halves(t):
        return np.sum(t < 30), np.sum(t >= 30)

    first, second = halves(schedule(50, 60, "step", seed=4))
    assert second / first == pytest.approx(3.0, rel=0.15)           # rate/2 then 3·rate/2
    first, second = halves(schedule(50, 60, "ramp", seed=4))
    assert second / first == pytest.approx(3.0, rel=0.15)           # 0 -> 2·rate: a quarter, then three quarters
    diurnal = schedule(50, 60, "diurnal", seed=4)
    assert np.sum(diurnal < 30) > 2 * np.sum(diurnal >= 30)          # day, then night


def test_gamma_arrivals_are_burstier_than_poisson():
    def cv(t):
        return float(np.std(np.diff(t)) / np.mean(np.diff(t)))

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


# The LLM workload: length distributions, and streaming clients timed against the LLM-mode server's own metrics.

@pytest.mark.parametrize("kind,spread", [("lognormal", 1.0), ("uniform", 0.5), ("fixed", 0.0)])
def test_length_distributions_keep_their_mean_and_bounds(kind, spread):
    lengths = Lengths(161, spread, 100_000, kind).draw(np.random.default_rng(1), 20_000)
    assert lengths.mean() == pytest.approx(161, rel=0.04) and lengths.min() >= 1
    if kind == "lognormal":                               # sigma 1: median = mean / e^0.5
        assert np.median(lengths) == pytest.approx(161 / math.exp(0.5), rel=0.05)
    assert Lengths(161, spread, 50, kind).draw(np.random.default_rng(1), 1000).max() <= 50


def test_bad_length_parameters_are_named():
    with pytest.raises(ValueError, match="unknown length distribution 'zipf'; choose one of lognormal"):
        Lengths(10, 1, 100, "zipf")
    with pytest.raises(ValueError, match="spread"):
        Lengths(10, 2, 100, "uniform")


def test_prompts_are_exactly_as_many_tokens_as_drawn():
    rng = np.random.default_rng(2)
    assert [len(prompt_text(rng, n).encode()) for n in (1, 2, 7, 100)] == [1, 2, 7, 100]


def test_streaming_llm_load_agrees_with_the_servers_own_timing(llm, tmp_path):  # noqa: F811
    before = llm.metrics()
    records = run_llm_load(llm.url + "/v1/completions", rate=8, duration_s=3, prompt=Lengths(40, 0.5, 80),
                           output=Lengths(20, 0.5, 40), bad_share=0.2, seed=3)
    after = llm.metrics()

    def delta(name):
        return after[(name, "")] - before[(name, "")]

    ok = [r for r in records if r.ok]
    bad = [r for r in records if r.status == 404]
    assert len(records) == len(schedule(8, 3, seed=3)) and len(ok) + len(bad) == len(records) and bad
    assert all(len(r.gaps_s) == r.output_tokens - 1 and r.ttft_s <= r.e2e_s for r in ok)
    # Every token the server timed, the client saw: counts exact, times close (the client adds the wire).
    assert delta("inference_time_to_first_token_seconds_count") == len(ok)
    assert delta("inference_inter_token_latency_seconds_count") == sum(len(r.gaps_s) for r in ok)
    server_ttft = delta("inference_time_to_first_token_seconds_sum") / len(ok)
    client_ttft = sum(r.ttft_s for r in ok) / len(ok)
    assert 0.9 * server_ttft <= client_ttft <= server_ttft + 0.05, (client_ttft, server_ttft)
    server_gaps, client_gaps = delta("inference_inter_token_latency_seconds_sum"), sum(sum(r.gaps_s) for r in ok)
    assert client_gaps == pytest.approx(server_gaps, rel=0.2, abs=0.05 * len(ok))
    summary = summarize_llm(records, 3, slo_ttft_s=60, slo_tpot_s=60)
    assert summary["goodput_rps"] == summary["completed_rps"] == len(ok) / 3
    assert summary["statuses"] == {200: len(ok), 404: len(bad)}
    assert summarize_llm(records, 3, slo_ttft_s=0)["goodput_rps"] == 0
    path = tmp_path / "llm.csv"
    write_csv(records, path)
    rows = list(csv.DictReader(path.open()))
    assert len(rows) == len(records) and {"ttft_s", "gaps_s", "e2e_s", "status"} <= set(rows[0])
    assert sum(len(r["gaps_s"].split()) for r in rows) == sum(len(r.gaps_s) for r in records)
