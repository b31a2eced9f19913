"""Continuous-batching policies on hand-built windows (which knob moves, which way, how far,
within which bounds), purity, the iteration-level simulator against the step-time model
worked out by hand, and the daemon's builder and config for the tuner."""
import math

import numpy as np
import pytest

from bench.sim import continuous as sim
from bench.sim import continuous_batch_bench as bench
from slotune import config
from slotune.config import ServiceConf
from slotune.control.observations import Inputs
from slotune.control.tuner_specs import SPECS
from slotune.model.histogram import BucketHistogram, Histogram
from slotune.model.service import ServiceSpec
from slotune.model.window import Window
from tests.tuners.purity import assert_pure
from slotune.tuners import continuous_batch as cb

P = cb.POLICIES
START = {cb.SEQS: 64.0, cb.TOKENS: 512.0}
SLO_TTFT, SLO_TPOT = 1.0, 0.025
TPOT_TARGET = cb.TARGET * SLO_TPOT


def obs(ttft=0.2, itl=0.010, running=20.0, waiting=0.0, kv=0.3, preempted=0.0, tokens=60.0, tokens_p99=200.0,
        requests=40, now=2.0):
    return cb.Observation(now=now, slo_ttft_s=SLO_TTFT, slo_tpot_s=SLO_TPOT, ttft_p99_s=ttft, tpot_p99_s=itl,
                          itl_mean_s=itl, requests=requests, running=running, waiting=waiting, kv_usage=kv,
                          preemptions=preempted, step_tokens=tokens, step_tokens_p99=tokens_p99)


def decide(o, settings=START, name="slotune"):
    p = P[name]
    return p.decide(p.initial_state(settings), o)


def test_both_within_target_holds():
    _, d = decide(obs())
    assert d.changes == {} and "both within target" in d.reason


def test_ttft_over_with_sequences_waiting_for_a_slot_raises_seqs_by_the_tpot_headroom():
    _, d = decide(obs(ttft=1.5, itl=0.5 * TPOT_TARGET, running=64.0, waiting=30.0))
    assert d.changes == {cb.SEQS: 96.0}                  # headroom x2, capped at x1.5
    _, d = decide(obs(ttft=1.5, itl=0.8 * TPOT_TARGET, running=64.0, waiting=30.0))
    assert d.changes == {cb.SEQS: 80.0}                  # x1/0.8: TPOT stays within its target


def test_ttft_over_with_prefill_held_back_by_the_token_budget_raises_the_budget():
    _, d = decide(obs(ttft=1.5, itl=0.5 * TPOT_TARGET, running=20.0, waiting=2.0, tokens=400.0, tokens_p99=512.0))
    assert d.changes == {cb.TOKENS: 768.0}


def test_ttft_over_without_tpot_headroom_or_with_nothing_binding_holds():
    _, d = decide(obs(ttft=1.5, itl=TPOT_TARGET, running=64.0, waiting=30.0))
    assert d.changes == {} and "no TPOT headroom" in d.reason
    _, d = decide(obs(ttft=1.5, itl=0.5 * TPOT_TARGET, running=10.0, waiting=0.0, tokens_p99=100.0))
    assert d.changes == {} and "neither setting binding" in d.reason


def test_tpot_over_narrows_the_step_by_the_overshoot():
    _, d = decide(obs(itl=1.25 * TPOT_TARGET, running=60.0, tokens_p99=400.0))
    assert d.changes == {cb.SEQS: 48.0, cb.TOKENS: 320.0}   # both x0.8
    _, d = decide(obs(itl=4 * TPOT_TARGET, running=60.0, tokens_p99=400.0))
    assert d.changes == {cb.SEQS: 30.0, cb.TOKENS: 200.0}   # at most halved in one decision


def test_tpot_over_wins_over_ttft_over_while_ttft_is_within_its_slo():
    _, d = decide(obs(ttft=0.95, itl=1.25 * TPOT_TARGET, running=64.0, waiting=50.0, tokens_p99=400.0))
    assert d.changes[cb.SEQS] < START[cb.SEQS] and d.changes[cb.TOKENS] < START[cb.TOKENS]


def test_preemptions_bring_seqs_under_what_the_cache_held_and_a_full_cache_stops_growth():
    _, d = decide(obs(preempted=12.0, kv=1.0, running=40.0))
    assert d.changes == {cb.SEQS: 36.0}
    _, d = decide(obs(ttft=1.5, itl=0.5 * TPOT_TARGET, kv=0.97, running=64.0, waiting=30.0))
    assert cb.SEQS not in d.changes


def test_bounds_hold_and_seqs_never_exceed_the_token_budget():
    top = {cb.SEQS: cb.SEQS_BOUNDS[1], cb.TOKENS: cb.SEQS_BOUNDS[1]}
    _, d = decide(obs(ttft=2.0, itl=0.1 * TPOT_TARGET, running=top[cb.SEQS], waiting=100.0), top)
    assert d.changes == {}                               # at the top of its range
    _, d = decide(obs(itl=10 * TPOT_TARGET, running=1.0, tokens_p99=1.0), {cb.SEQS: 1.0, cb.TOKENS: 16.0})
    assert d.changes == {}                               # already at the floor of both
    s, d = decide(obs(itl=1.25 * TPOT_TARGET, running=60.0, tokens_p99=40.0))
    assert d.changes == {cb.SEQS: 48.0, cb.TOKENS: 48.0}   # the budget keeps one token per running sequence


def test_settings_are_read_within_bounds_and_a_missing_one_is_named():
    s = P["slotune"].initial_state({cb.SEQS: 5000.0, cb.TOKENS: 100.0})
    assert (s.seqs, s.tokens) == (100.0, 100.0)
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        P["slotune"].initial_state({cb.SEQS: 8.0})


def test_a_window_without_requests_changes_nothing():
    for name in P:
        _, d = decide(obs(requests=0, ttft=0.0, itl=0.0, now=60.0), name=name)
        assert d.changes == {} or name == "whitepaper"


def test_whitepaper_sets_seqs_from_the_tpot_slo_every_30_s_and_leaves_the_budget():
    wp = P["whitepaper"]
    s, d = wp.decide(wp.initial_state(START), obs(now=2.0))
    assert d.changes == {cb.SEQS: 18.0}                  # ((0.8*25 - 8.3) / 2.688)^2 = 18.9
    s, d = wp.decide(s, obs(now=20.0))
    assert d.changes == {}
    s = wp.resync(s, {cb.SEQS: 40.0, cb.TOKENS: 512.0})
    _, d = wp.decide(s, obs(now=33.0))
    assert d.changes == {cb.SEQS: 18.0}


def test_pure():
    windows = [obs(now=2.0 * i, ttft=t, itl=i_, running=r, waiting=w)
               for i, (t, i_, r, w) in enumerate([(0.2, 0.01, 10, 0), (1.5, 0.01, 64, 20), (2.0, 0.03, 80, 40),
                                                  (0.3, 0.01, 30, 0)], 1)]
    assert_pure(P, START, windows)


# --- the simulator


def test_one_request_alone_takes_the_steps_the_model_says():
    step = sim.StepModel(noise_sigma=0.0)
    server = sim.Server(step, 10_000, SLO_TTFT, SLO_TPOT)
    work = sim.Workload(np.array([0.5]), np.array([300]), np.array([11]))
    static = bench.static()
    res = sim.run(static, server, work, {cb.SEQS: 8.0, cb.TOKENS: 128.0}, np.random.default_rng(0), 5.0)
    prefill = 2 * step.seconds(128, 1) + step.seconds(44, 1)        # 300 tokens in chunks of 128, 128, 44
    assert res.ttft[0] == pytest.approx(prefill)
    assert res.tpot[0] == pytest.approx(step.seconds(1, 1))         # then one decode per step
    assert res.good(server).tolist() == [True]


def test_a_small_cache_preempts_the_newest_and_every_request_still_finishes():
    server = sim.Server(sim.StepModel(), 3_000, SLO_TTFT, SLO_TPOT)
    n = 30
    work = sim.Workload(np.linspace(0.0, 0.3, n), np.full(n, 200), np.full(n, 100))
    res = sim.run(bench.static(), server, work, {cb.SEQS: 32.0, cb.TOKENS: 512.0}, np.random.default_rng(1), 60.0)
    assert res.preemptions > 0
    assert np.isfinite(res.tpot).all()                   # 30 x 300 tokens through a 3000-token cache
    assert np.argmax(res.ttft) > n // 2                  # the newest waited longest


def test_sarathi_budget_fits_an_all_decode_step_in_the_tpot_slo():
    step = bench.STEP
    m = bench.sarathi_budget(step, SLO_TPOT)
    assert step.seconds(m, m) <= SLO_TPOT < step.seconds(m + 1, m + 1)


def test_on_a_load_step_slotune_beats_vllm_s_defaults():
    runs = {p: [bench.run_one(p, "load_step", seed, quick=True)["goodput_ratio"] for seed in range(3)]
            for p in ("slotune", "vllm_default")}
    assert np.mean(runs["slotune"]) > np.mean(runs["vllm_default"]) + 0.02, runs


# --- in the daemon: its spec's builder and config


def test_the_builder_reads_the_llm_server_s_signals_from_the_windows():
    def hist(values_s):
        return Histogram.from_values(np.asarray(values_s) * 1e9)

    steps = BucketHistogram.from_cumulative([(64.0, 30.0), (128.0, 90.0), (256.0, 100.0), (math.inf, 100.0)], 9000.0)
    windows = [Window("llm", t, t + 1.0, 0.5, slo_ttft_s=1.0, slo_tpot_s=0.025,
                      ttft=hist(np.full(50, 0.2 + 0.1 * t)), tpot=hist(np.full(500, 0.010 + 0.002 * t)),
                      histograms={("inference_iteration_tokens", ""): steps},
                      counters={("inference_num_preemptions_total", ""): 3.0},
                      gauges={("inference_num_requests_running", ""): 20.0 + 10 * t,
                              ("inference_num_requests_waiting", ""): 4.0, ("inference_kv_cache_usage_ratio", ""): 0.3 + 0.2 * t})
               for t in range(2)]
    spec = ServiceSpec("llm", cmdline="llm", slo_ttft_p99_s=1.0, slo_tpot_p99_s=0.025)
    o = SPECS["continuous_batch"].observe(Inputs(2.0, windows, windows, ServiceConf(spec), {}, 2.0, lambda *a: None))
    assert (o.slo_ttft_s, o.slo_tpot_s, o.requests) == (1.0, 0.025, 100)
    assert o.ttft_p99_s == pytest.approx(0.3, rel=0.05) and o.tpot_p99_s == pytest.approx(0.012, rel=0.05)
    assert o.itl_mean_s == pytest.approx(0.011, rel=0.05)
    assert (o.running, o.waiting, o.kv_usage, o.preemptions) == (25.0, 4.0, 0.5, 6.0)
    assert o.step_tokens == pytest.approx(90.0) and 128.0 <= o.step_tokens_p99 <= 256.0


def test_the_config_wants_both_token_slos_for_this_tuner(tmp_path):
    path = tmp_path / "slotune.toml"
    table = ("[services.llm]\ncmdline = 'llm'\nslo_ttft_p99_ms = 1000\n{tpot}[services.llm.control]\nkind = 'file'\n"
             "path = '/tmp/llm.json'\n[services.llm.tuners.continuous_batch]\n" +
             "".join(f"[services.llm.settings.{s}]\nmin = 1\nmax = 4096\nmax_step = 512\ninteger = true\n"
                     for s in (cb.SEQS, cb.TOKENS)))
    path.write_text(table.format(tpot=""))
    with pytest.raises(config.ConfigError, match="tuner continuous_batch steers on it") as err:
        config.load(path)
    assert err.value.key == "services.llm.slo_tpot_p99_ms"
    path.write_text(table.format(tpot="slo_tpot_p99_ms = 25\n"))
    [tuner] = config.load(path).service("llm").tuners
    assert (tuner.name, tuner.policy) == ("continuous_batch", "slotune")


def test_tpot_over_from_prefill_chunks_cuts_only_the_token_budget():
    _, d = decide(obs(itl=2 * TPOT_TARGET, running=8.0, tokens=900.0, tokens_p99=2048.0), {cb.SEQS: 256.0, cb.TOKENS: 2048.0})
    assert d.changes == {cb.TOKENS: 1024.0} and "mostly prefill" in d.reason


def test_a_full_cache_with_tpot_over_narrows_the_step_by_the_tpot_rule_not_the_budget_alone():
    # steps mostly decodes (2.5 tokens per sequence): the width made them long; the cut is at most halved
    _, d = decide(obs(preempted=3.0, kv=1.0, running=60.0, itl=4 * TPOT_TARGET, tokens=150.0, tokens_p99=700.0))
    assert d.changes == {cb.SEQS: 30.0, cb.TOKENS: 350.0}
    _, d = decide(obs(kv=0.97, running=8.0, itl=2 * TPOT_TARGET, tokens=900.0, tokens_p99=2048.0),
                  {cb.SEQS: 256.0, cb.TOKENS: 2048.0})
    assert d.changes == {cb.SEQS: 8.0, cb.TOKENS: 1024.0} and "mostly prefill" in d.reason


def test_tpot_over_with_requests_waiting_past_the_ttft_slo_holds_the_width():
    # the waiting requests already missed TTFT: narrowing would only drain them slower
    _, d = decide(obs(ttft=3.0, itl=4 * TPOT_TARGET, running=60.0, waiting=40.0, tokens_p99=400.0))
    assert d.changes == {} and "past the TTFT SLO" in d.reason
    _, d = decide(obs(ttft=3.0, itl=4 * TPOT_TARGET, running=60.0, waiting=40.0, kv=1.0, preempted=2.0))
    assert d.changes == {cb.SEQS: 54.0}                  # the cache rule still holds: no more than it can keep
