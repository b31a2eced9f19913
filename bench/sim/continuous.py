"""An LLM server that batches continuously, one iteration at a time, as vLLM's V1 scheduler
does: each step first gives every running sequence its tokens (one per decode, a chunk of
what is left of a prefill) in the order they were admitted, then admits waiting sequences
while fewer than max_num_seqs run, all within max_num_batched_tokens (chunked prefill). The
KV cache holds kv_tokens tokens; when a running sequence cannot get its next tokens the
newest running sequence is preempted (its cache freed, recomputed on readmission, ahead of
the queue). A step takes (a + b*tokens + c*seqs) * lognormal noise, the coefficients fitted on
the reference decoder by bench/step_time_fit.py. A policy retunes both settings every
INTERVAL_S from the window's token latencies and the scheduler's gauges."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from slotune.tuners import continuous_batch as cb


@dataclass(frozen=True)
class StepModel:
    """time(step) = a + b*tokens + c*seqs, seconds."""
    a_s: float = 1.12e-3
    b_s: float = 75e-6
    c_s: float = 280e-6
    noise_sigma: float = 0.05

    def seconds(self, tokens: int, seqs: int) -> float:
        return self.a_s + self.b_s * tokens + self.c_s * seqs


@dataclass(frozen=True)
class Server:
    step: StepModel
    kv_tokens: int
    slo_ttft_s: float
    slo_tpot_s: float


@dataclass(frozen=True)
class Workload:
    arrivals: np.ndarray     # seconds, sorted
    prompt: np.ndarray       # tokens per request
    output: np.ndarray       # tokens to generate per request


@dataclass
class Result:
    ttft: np.ndarray         # per request, inf when it never got a first token
    tpot: np.ndarray         # per request: (finish - first token) / (output - 1); inf when unfinished
    preemptions: int

    def good(self, server: Server) -> np.ndarray:
        return (self.ttft <= server.slo_ttft_s) & (self.tpot <= server.slo_tpot_s)


def _window() -> dict:
    """What one control window gathers of the steps: their count, running and waiting sums, the
    largest KV share, preemptions, tokens per step, and the sum and count of inter-token gaps."""
    return {"steps": 0, "running": 0.0, "waiting": 0.0, "kv": 0.0, "preempted": 0, "tokens": [], "gaps": 0.0, "gap_n": 0}


def _p99(values: np.ndarray) -> float:
    return float(np.quantile(values, 0.99)) if values.size else 0.0


def run(policy, server: Server, work: Workload, settings: dict[str, float], rng: np.random.Generator,
        until_s: float) -> Result:
    """Simulate up to until_s; a request not done by then misses both SLOs."""
    n = work.arrivals.size
    prompt, output = work.prompt.astype(np.int64), work.output.astype(np.int64)
    ctx = np.zeros(n, np.int64)          # tokens of the sequence in the KV cache
    gen = np.zeros(n, np.int64)          # output tokens generated so far
    first = np.full(n, np.inf)
    last = np.full(n, np.inf)            # when the sequence's latest token came
    finish = np.full(n, np.inf)
    state = policy.initial_state(settings)
    seqs, tokens = int(settings[cb.SEQS]), int(settings[cb.TOKENS])
    running: list[int] = []
    waiting: list[int] = []              # preempted sequences go back to its head
    nxt = 0                              # next arrival not yet queued
    used = 0                             # KV tokens in use
    preempted = 0
    now, tick = 0.0, cb.INTERVAL_S
    noise_mean = float(np.exp(server.step.noise_sigma ** 2 / 2))
    win = _window()
    while now < until_s:
        while nxt < n and work.arrivals[nxt] <= now:
            waiting.append(nxt)
            nxt += 1
        if now >= tick:
            state, seqs, tokens = _decide(policy, state, server, win, now, first, finish, work, output, seqs, tokens)
            win = _window()
            tick += cb.INTERVAL_S
        if not running and not waiting:
            now = min(work.arrivals[nxt] if nxt < n else until_s, tick)
            continue
        # running sequences first, in admission order; the newest is preempted when the cache is full
        budget, plan, i = tokens, [], 0
        while i < len(running) and budget > 0:
            r = running[i]
            chunk = int(min(prompt[r] + gen[r] - ctx[r], budget))
            while used + chunk > server.kv_tokens and running:
                victim = running.pop()
                used -= int(ctx[victim])
                ctx[victim] = 0
                waiting.insert(0, victim)
                preempted += 1
                win["preempted"] += 1
                if victim == r:
                    break
            if r not in running[i:i + 1]:
                break
            plan.append((r, chunk))
            used += chunk
            budget -= chunk
            i += 1
        while waiting and len(running) < seqs and budget > 0:
            r = waiting[0]
            chunk = int(min(prompt[r] + gen[r] - ctx[r], budget))
            if used + chunk > server.kv_tokens:
                break
            waiting.pop(0)
            running.append(r)
            plan.append((r, chunk))
            used += chunk
            budget -= chunk
        step_tokens = tokens - budget
        dt = server.step.seconds(step_tokens, len(plan)) * rng.lognormal(0.0, server.step.noise_sigma) / noise_mean
        now += dt
        win["steps"] += 1
        win["running"] += len(running)
        win["waiting"] += len(waiting)
        win["kv"] = max(win["kv"], used / server.kv_tokens)
        win["tokens"].append(step_tokens)
        for r, chunk in plan:
            complete = ctx[r] + chunk == prompt[r] + gen[r]
            ctx[r] += chunk
            if complete:               # the step ends with one more token for this sequence
                gen[r] += 1
                if gen[r] == 1:
                    first[r] = now
                else:
                    win["gaps"] += now - last[r]
                    win["gap_n"] += 1
                last[r] = now
                if gen[r] == output[r]:
                    finish[r] = now
                    running.remove(r)
                    used -= int(ctx[r])
                    ctx[r] = 0
    ttft = first - work.arrivals
    with np.errstate(invalid="ignore"):      # unfinished: inf - inf
        tpot = np.where(np.isfinite(finish), (finish - first) / np.maximum(output - 1, 1), np.inf)
    return Result(ttft, tpot, preempted)


def _decide(policy, state, server: Server, win: dict, now: float, first, finish, work: Workload, output,
            seqs: int, tokens: int):
    lo = now - cb.INTERVAL_S
    firsts = (first > lo) & (first <= now)
    done = (finish > lo) & (finish <= now)
    tpot = (finish[done] - first[done]) / np.maximum(output[done] - 1, 1)
    steps = max(win["steps"], 1)
    obs = cb.Observation(
        now=now, slo_ttft_s=server.slo_ttft_s, slo_tpot_s=server.slo_tpot_s,
        ttft_p99_s=_p99(first[firsts] - work.arrivals[firsts]), tpot_p99_s=_p99(tpot),
        itl_mean_s=win["gaps"] / win["gap_n"] if win["gap_n"] else 0.0,
        requests=int(np.count_nonzero(firsts | done)), running=win["running"] / steps, waiting=win["waiting"] / steps,
        kv_usage=win["kv"], preemptions=float(win["preempted"]),
        step_tokens=float(np.mean(win["tokens"])) if win["tokens"] else 0.0,
        step_tokens_p99=float(np.quantile(win["tokens"], 0.99)) if win["tokens"] else 0.0)
    state, decision = policy.decide(state, obs)
    seqs = int(decision.changes.get(cb.SEQS, seqs))
    tokens = int(decision.changes.get(cb.TOKENS, tokens))
    return state, seqs, tokens
