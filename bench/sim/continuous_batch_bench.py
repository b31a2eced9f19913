"""Continuous-batching scenarios and per-run metrics: goodput (the share of offered requests
meeting both the TTFT and the TPOT SLO, DistServe's count), TTFT and TPOT P99, preemptions.
Every tuner policy starts from vLLM's defaults; beside them three static anchors:
- vllm_default: max_num_seqs 256, max_num_batched_tokens 2048, what `vllm serve` sets on a
  GPU under 70 GiB or an A100 (vllm/engine/arg_utils.py, EngineArgs.get_batch_defaults,
  UsageContext.OPENAI_API_SERVER; chunked prefill always on in V1, docs.vllm.ai
  configuration/optimization.md "Chunked Prefill");
- sarathi: Sarathi-Serve's fixed token budget (Agrawal et al., OSDI 2024): the largest
  budget whose step, profiled at its worst (every token a decode), fits the TPOT SLO;
- oracle: the best static grid point, from a sweep on seeds no measured run uses."""
from __future__ import annotations

import functools

import numpy as np

from bench.sim import arrivals, continuous as sim
from slotune.tuners import continuous_batch as cb
from slotune.tuners.base import Decision, Policy

SCENARIOS = ("load_step", "ramp", "long_prompt_burst", "output_shift", "kv_pressure")
POLICIES = ("slotune", "whitepaper", "vllm_default", "sarathi", "oracle")
METRICS = (("goodput_ratio", "goodput/offered", "high"), ("ttft_p99_ms", "TTFT P99 ms", "low"),
           ("tpot_p99_ms", "TPOT P99 ms", "low"), ("preemptions", "preempted", "low"))
PRIMARY = "goodput_ratio"
STEP = sim.StepModel()
SLO_TTFT_S, SLO_TPOT_S = 1.0, 0.025
VLLM_DEFAULT = {cb.SEQS: 256.0, cb.TOKENS: 2048.0}
PROMPT_MEAN, OUTPUT_MEAN = 256, 128       # tokens; lognormal, sigma 1.0 and 0.8
CAPACITY_RPS = 14.0                        # requests/s the server carries at these lengths (swept)
ORACLE_SEQS = (16, 32, 48, 64, 256)
ORACLE_TOKENS = (128, 512, 2048)
DRAIN_S = 20.0                             # after the last arrival, for the last requests to finish


def sarathi_budget(step: sim.StepModel, slo_tpot_s: float) -> float:
    """The largest token budget whose all-decode step stays within the TPOT SLO."""
    return float(int((slo_tpot_s - step.a_s) / (step.b_s + step.c_s)))


def _lengths(rng, n: int, mean: float, sigma: float, high: int) -> np.ndarray:
    return np.clip(np.round(rng.lognormal(np.log(mean) - sigma ** 2 / 2, sigma, n)), 2, high).astype(np.int64)


def _server(scenario: str) -> sim.Server:
    kv = 16_000 if scenario == "kv_pressure" else 10_000_000
    return sim.Server(STEP, kv, SLO_TTFT_S, SLO_TPOT_S)


def workload(scenario: str, duration: int, rng) -> sim.Workload:
    t = np.arange(duration, dtype=float)
    burst = np.abs(t - duration / 2) < duration / 12          # a sixth of the run, half-way
    later = t >= duration / 3
    c = CAPACITY_RPS
    if scenario in ("load_step", "kv_pressure"):   # 0.5C, 1.3C for a sixth of the run, 0.5C
        rates = np.where(burst, 1.3, 0.5) * c
    elif scenario == "ramp":                       # 0.2C -> 1.2C
        rates = np.linspace(0.2, 1.2, duration) * c
    elif scenario in ("long_prompt_burst", "output_shift"):
        rates = np.full(duration, 0.5 * c)
    else:
        raise ValueError(f"unknown continuous_batch scenario {scenario!r}; use one of {SCENARIOS}")
    times = arrivals.poisson(rates, rng)
    n = times.size
    prompt = _lengths(rng, n, PROMPT_MEAN, 1.0, 4096)
    output = _lengths(rng, n, OUTPUT_MEAN, 0.8, 1024)
    second = times.astype(int)
    if scenario == "long_prompt_burst":            # during the burst, a third of the prompts are documents
        docs = burst[second] & (rng.random(n) < 1 / 3)
        prompt[docs] = _lengths(rng, int(docs.sum()), 3072, 0.3, 8192)
    elif scenario == "output_shift":
        shifted = later[second]
        output[shifted] = _lengths(rng, int(shifted.sum()), 2 * OUTPUT_MEAN, 0.8, 1024)
    return sim.Workload(times, prompt, output)


def static() -> Policy:
    return Policy("static", "held", lambda s: None, lambda s, o: (s, Decision({}, "static")))


def _simulate(policy, settings, scenario: str, seed: int, duration: int) -> tuple[sim.Result, sim.Server]:
    rng = np.random.default_rng(seed)
    work, server = workload(scenario, duration, rng), _server(scenario)
    return sim.run(policy, server, work, dict(settings), rng, duration + DRAIN_S), server


def _goodput(res: sim.Result, server: sim.Server) -> float:
    return float(res.good(server).mean()) if res.ttft.size else 0.0


@functools.lru_cache(maxsize=None)
def oracle_settings(scenario: str, duration: int) -> tuple[float, float]:
    """The best static (max_num_seqs, max_num_batched_tokens) on two sweep seeds: the highest
    goodput, and among equal goodputs (every request within both SLOs) the lowest TTFT P99."""
    grid = [(s, t) for s in ORACLE_SEQS for t in ORACLE_TOKENS if t >= s]
    score = {}
    for s, t in grid:
        settings = {cb.SEQS: float(s), cb.TOKENS: float(t)}
        runs = [_simulate(static(), settings, scenario, 10_000 + k, duration) for k in range(2)]
        score[(s, t)] = (np.mean([_goodput(*run) for run in runs]),
                         -np.mean([np.quantile(res.ttft, 0.99) for res, _ in runs]))
    return max(grid, key=score.get)


def _policy(name: str, scenario: str, duration: int) -> tuple[Policy, dict[str, float]]:
    if name == "vllm_default":
        return static(), dict(VLLM_DEFAULT)
    if name == "sarathi":
        settings = {cb.SEQS: VLLM_DEFAULT[cb.SEQS], cb.TOKENS: sarathi_budget(STEP, SLO_TPOT_S)}
        return static(), settings
    if name == "oracle":
        s, t = oracle_settings(scenario, duration)
        settings = {cb.SEQS: float(s), cb.TOKENS: float(t)}
        return static(), settings
    return cb.POLICIES[name], dict(VLLM_DEFAULT)


def run_one(policy_name: str, scenario: str, seed: int, quick: bool) -> dict[str, float]:
    duration = 90 if quick else 150
    policy, settings = _policy(policy_name, scenario, duration)
    res, server = _simulate(policy, settings, scenario, seed, duration)
    return {"goodput_ratio": _goodput(res, server),
            "ttft_p99_ms": float(np.quantile(res.ttft, 0.99) * 1e3) if res.ttft.size else 0.0,
            "tpot_p99_ms": float(np.quantile(res.tpot, 0.99) * 1e3) if res.tpot.size else 0.0,
            "preemptions": float(res.preemptions)}
