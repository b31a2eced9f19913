"""The open-loop load generator: arrivals follow a schedule fixed in advance
(Poisson or gamma-bursty, shaped by a rate profile) and never wait for
answers; a request's latency counts from its scheduled time, so a slow server
cannot hide its queue (no coordinated omission). Above max_inflight, arrivals
are counted as errors ("overflow") instead of being sent. This module drives
the gateway; llm/load.py drives an LLM server with the same schedules. realtime()
keeps a client's clock on time beside a busy server on a small host."""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import math
import os
import threading
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import aiohttp
import numpy as np

from .corpus import QueryStream
from .ports import port

@contextlib.contextmanager
def realtime(priority: int = 10):
    """The calling thread at SCHED_FIFO `priority` for the block: a streaming client's clock
    that a busy host's run queue does not make late (its reads wake it at once; it waits in
    epoll the rest of the time, so it takes no CPU from the server it times)."""
    before = os.sched_getscheduler(0), os.sched_getparam(0)
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
    try:
        yield
    finally:
        os.sched_setscheduler(0, before[0], before[1])


PROFILES = ("constant", "step", "ramp", "diurnal")
ARRIVALS = ("poisson", "gamma")


@dataclass
class Record:
    t_s: float            # scheduled arrival, seconds from the start
    latency_s: float      # from scheduled arrival to answer (nan when not sent)
    status: int           # HTTP status, 0 when no answer
    outcome: str          # ok, degraded, rejected, error
    cache: str            # the cache level that answered, "" when none
    query: str
    error: str = ""


def rate_at(profile: str, rate: float, t: np.ndarray, duration_s: float) -> np.ndarray:
    """Offered rate at times t; every profile averages `rate` over the run.
    step: rate/2 then 3·rate/2 from half-time; ramp: 0 -> 2·rate linearly;
    diurnal: rate·(1 + 0.8·sin), one period over the run."""
    if profile == "constant":
        return np.full_like(t, rate)
    if profile == "step":
        return np.where(t < duration_s / 2, rate / 2, 1.5 * rate)
    if profile == "ramp":
        return 2 * rate * t / duration_s
    if profile == "diurnal":
        return rate * (1 + 0.8 * np.sin(2 * math.pi * t / duration_s))
    raise ValueError(f"unknown profile {profile!r}; choose one of {', '.join(PROFILES)}")


def schedule(rate: float, duration_s: float, profile: str = "constant", arrivals: str = "poisson",
             burstiness: float = 0.25, seed: int = 1) -> np.ndarray:
    """Arrival times in seconds. Gaps are drawn in unit-rate time (exponential, or gamma with shape
    `burstiness`: CV = 1/sqrt(shape)) and mapped through the profile's cumulative rate."""
    if rate <= 0 or duration_s <= 0:
        raise ValueError(f"rate ({rate}) and duration ({duration_s}) must be positive")
    if arrivals not in ARRIVALS:
        raise ValueError(f"unknown arrivals {arrivals!r}; choose one of {', '.join(ARRIVALS)}")
    rng = np.random.default_rng(seed)
    dt = 0.001
    grid = np.arange(0.0, duration_s + dt, dt)
    cumulative = np.concatenate([[0.0], np.cumsum(rate_at(profile, rate, grid[:-1], duration_s) * dt)])
    n = int(cumulative[-1] * 1.5 + 50)
    gaps = rng.exponential(1.0, n) if arrivals == "poisson" else rng.gamma(burstiness, 1.0 / burstiness, n)
    targets = np.cumsum(gaps)
    targets = targets[targets < cumulative[-1]]
    return np.interp(targets, cumulative, grid)


async def open_loop(times: np.ndarray, max_inflight: int, send, overflow, until: threading.Event | None = None) -> None:
    """At each scheduled time (seconds from now) start send(i, t_s, t_abs) as a task, never waiting for
    answers; when max_inflight are in flight, call overflow(i, t_s) instead. Sends nothing more once
    `until` is set. Returns when all sent are answered."""
    inflight = 0

    async def tracked(coro):
        nonlocal inflight
        try:
            await coro
        finally:
            inflight -= 1

    tasks = []
    t0 = time.monotonic()
    for i, t_s in enumerate(times):
        delay = t0 + t_s - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        if until is not None and until.is_set():
            break
        if inflight >= max_inflight:
            overflow(i, float(t_s))
            continue
        inflight += 1
        tasks.append(asyncio.create_task(tracked(send(i, float(t_s), t0 + t_s))))
    await asyncio.gather(*tasks)


async def generate_load(url: str, rate: float, duration_s: float, profile: str = "constant",
                        arrivals: str = "poisson", burstiness: float = 0.25, max_inflight: int = 512,
                        timeout_s: float = 10.0, seed: int = 1, queries: QueryStream | None = None,
                        context_bytes: int = 0, until: threading.Event | None = None) -> list[Record]:
    """Drive url (the gateway's POST /query) open loop; one Record per arrival sent.
    context_bytes > 0 sends a context document that long with each query, as a RAG
    prompt carries one (the gateway ignores it); `until`, once set, ends the load early
    (a test that polls for its outcome)."""
    times = schedule(rate, duration_s, profile, arrivals, burstiness, seed)
    queries = queries or QueryStream(seed=seed)
    texts = [queries.next() for _ in times]
    context = {"context": "x" * context_bytes} if context_bytes > 0 else {}
    records: list[Record] = []

    async def one(session, i, t_s, t_abs):
        status, outcome, cache, error = 0, "error", "", ""
        try:
            async with session.post(url, json={"query": texts[i], **context}) as r:
                status = r.status
                body = await r.json(content_type=None)
                if status == 200:
                    outcome, cache = ("degraded" if body.get("degraded") else "ok"), body.get("cache") or ""
                elif status == 429:
                    outcome = "rejected"
                else:
                    error = str(body.get("error", ""))[:200]
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
            error = f"{type(e).__name__}: {e}"[:200]
        records.append(Record(t_s, time.monotonic() - t_abs, status, outcome, cache, texts[i], error))

    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=max_inflight), timeout=timeout) as session:
        await open_loop(times, max_inflight, lambda i, t_s, t_abs: one(session, i, t_s, t_abs),
                        lambda i, t_s: records.append(Record(t_s, math.nan, 0, "error", "", texts[i], "overflow")),
                        until)
    records.sort(key=lambda r: r.t_s)
    return records


async def closed_loop(url: str, clients: int, duration_s: float, seed: int) -> list[float]:
    """Latencies of answered queries from `clients` clients that each send the next query on an answer."""
    queries, latencies = QueryStream(seed=seed), []
    deadline = time.monotonic() + duration_s

    async def client(session):
        while time.monotonic() < deadline:
            began = time.monotonic()
            async with session.post(url, json={"query": queries.next()}) as r:
                await r.read()
                if r.status == 200 and time.monotonic() <= deadline:
                    latencies.append(time.monotonic() - began)

    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients), timeout=timeout) as session:
        await asyncio.gather(*(client(session) for _ in range(clients)))
    return latencies


def run_load(url: str, rate: float, duration_s: float, **kwargs) -> list[Record]:
    """generate_load from synchronous code (a fresh event loop)."""
    return asyncio.run(generate_load(url, rate, duration_s, **kwargs))


def summarize(records: list[Record], duration_s: float) -> dict:
    """Offered and answered rates, latency quantiles of answered (ok + degraded) requests, counts."""
    answered = np.array([r.latency_s for r in records if r.outcome in ("ok", "degraded")])
    quantile = (lambda q: float(np.quantile(answered, q))) if len(answered) else (lambda q: math.nan)
    outcomes, caches = {}, {}
    for r in records:
        outcomes[r.outcome] = outcomes.get(r.outcome, 0) + 1
        if r.cache:
            caches[r.cache] = caches.get(r.cache, 0) + 1
    return {"offered_rps": len(records) / duration_s, "answered_rps": len(answered) / duration_s,
            "p50_s": quantile(0.5), "p95_s": quantile(0.95), "p99_s": quantile(0.99),
            "errors": outcomes.get("error", 0), "overflow": sum(r.error == "overflow" for r in records),
            "outcomes": outcomes, "cache": caches}


def format_summary(s: dict) -> str:
    return (f"offered {s['offered_rps']:.1f} req/s, answered {s['answered_rps']:.1f} req/s, "
            f"P50 {s['p50_s'] * 1000:.1f} ms, P95 {s['p95_s'] * 1000:.1f} ms, P99 {s['p99_s'] * 1000:.1f} ms, "
            f"errors {s['errors']} (overflow {s['overflow']})\n"
            f"outcomes {s['outcomes']}  cache levels {s['cache']}")


def write_csv(records: list, path: Path) -> None:
    """One row per record (a Record, or llm/load.py's LlmRecord); a list field as space-separated numbers."""
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[fl.name for fl in fields(records[0])] if records else [])
        w.writeheader()
        for r in records:
            w.writerow({k: " ".join(f"{x:.6f}" for x in v) if isinstance(v, list) else v for k, v in asdict(r).items()})


WORKLOADS = ("query", "llm")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from .llm import load as llm_load
    parser.add_argument("--workload", choices=WORKLOADS, default="query",
                        help="query: the gateway's POST /query; llm: streaming OpenAI completions to the inference "
                             "server in LLM mode")
    parser.add_argument("--url", default=None,
                        help=f"query: the gateway's query endpoint (default http://127.0.0.1:{port('gateway')}/query); "
                             f"llm: /v1/completions or /v1/chat/completions (default "
                             f"http://127.0.0.1:{port('inference')}/v1/completions)")
    parser.add_argument("--rate", type=float, default=20.0, help="mean offered rate, requests/s")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds")
    parser.add_argument("--profile", choices=PROFILES, default="constant")
    parser.add_argument("--arrivals", choices=ARRIVALS, default="poisson")
    parser.add_argument("--burstiness", type=float, default=0.25, help="gamma shape (lower = burstier)")
    parser.add_argument("--max-inflight", type=int, default=512)
    parser.add_argument("--context-bytes", type=int, default=0,
                        help="query: a context document this long sent with each query (a RAG prompt's)")
    parser.add_argument("--timeout", type=float, default=None, help="per-request timeout, seconds (query 10, llm 60)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--csv", type=Path, default=None, help="write one row per request here")
    llm = parser.add_argument_group("llm workload (lengths in tokens; defaults: ShareGPT's means, see llm/load.py)")
    llm.add_argument("--lengths", choices=llm_load.DISTRIBUTIONS, default="lognormal")
    llm.add_argument("--prompt-mean", type=float, default=llm_load.SHAREGPT_PROMPT_MEAN)
    llm.add_argument("--prompt-spread", type=float, default=llm_load.SHAREGPT_SIGMA,
                     help="lognormal: sigma of the log; uniform: half-width as a share of the mean")
    llm.add_argument("--max-prompt", type=int, default=1024, help="longest prompt (the server's default context)")
    llm.add_argument("--output-mean", type=float, default=llm_load.SHAREGPT_OUTPUT_MEAN)
    llm.add_argument("--output-spread", type=float, default=llm_load.SHAREGPT_SIGMA)
    llm.add_argument("--max-output", type=int, default=512, help="largest max_tokens")
    llm.add_argument("--model", default="reference-decoder", help="the served model's name")
    llm.add_argument("--bad-share", type=float, default=0.0,
                     help="share of requests sent with an unknown model on purpose (404 errors)")
    llm.add_argument("--slo-ttft-ms", type=float, default=None, help="goodput counts requests within this TTFT")
    llm.add_argument("--slo-tpot-ms", type=float, default=None, help="... and within this time per output token")


def run(args) -> int:
    if args.workload == "llm":
        return _run_llm(args)
    try:
        records = run_load(args.url or f"http://127.0.0.1:{port('gateway')}/query", args.rate, args.duration,
                           profile=args.profile, arrivals=args.arrivals, burstiness=args.burstiness,
                           max_inflight=args.max_inflight, timeout_s=args.timeout or 10.0, seed=args.seed,
                           context_bytes=args.context_bytes)
    except ValueError as e:
        raise SystemExit(f"load: {e}") from None
    print(format_summary(summarize(records, args.duration)))
    if args.csv:
        write_csv(records, args.csv)
        print(f"wrote {len(records)} rows to {args.csv}")
    return 0


def _run_llm(args) -> int:
    from .llm import load as llm_load
    try:
        prompt = llm_load.Lengths(args.prompt_mean, args.prompt_spread, args.max_prompt, args.lengths)
        output = llm_load.Lengths(args.output_mean, args.output_spread, args.max_output, args.lengths)
        records = llm_load.run_llm_load(args.url or f"http://127.0.0.1:{port('inference')}/v1/completions",
                                        args.rate, args.duration, prompt, output, model=args.model,
                                        profile=args.profile, arrivals=args.arrivals, burstiness=args.burstiness,
                                        max_inflight=args.max_inflight, timeout_s=args.timeout or 60.0,
                                        bad_share=args.bad_share, seed=args.seed)
    except ValueError as e:
        raise SystemExit(f"load: {e}") from None

    def ms(v):
        return None if v is None else v / 1000

    print(llm_load.format_llm_summary(llm_load.summarize_llm(records, args.duration, ms(args.slo_ttft_ms),
                                                             ms(args.slo_tpot_ms))))
    if args.csv:
        write_csv(records, args.csv)
        print(f"wrote {len(records)} rows to {args.csv}")
    return 0
