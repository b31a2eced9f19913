"""Open-loop LLM load: arrivals on loadgen's schedule, prompt and output lengths
drawn from configurable distributions, and streaming clients that time, with
their own clock, each request's first token (TTFT), every gap between tokens
and its end; one record per request, the truth the server's metrics and the
kernel probes are checked against."""
from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass, field
from urllib.parse import urlparse

import aiohttp
import numpy as np

from ..loadgen import open_loop, schedule

DISTRIBUTIONS = ("lognormal", "uniform", "fixed")
# Mean lengths of ShareGPT conversations in tokens, input 161 and output 338: Kwon et al., "Efficient Memory
# Management for Large Language Model Serving with PagedAttention" (vLLM, SOSP 2023), section 6.1 (ShareGPT has
# 8.4x Alpaca's 19.31 input and 5.8x its 58.45 output tokens). The paper shows the length histograms (Fig. 11)
# but no spread: the lognormal's sigma of 1.0 (median = 0.61 x mean, a long right tail) is our choice, not its.
SHAREGPT_PROMPT_MEAN, SHAREGPT_OUTPUT_MEAN, SHAREGPT_SIGMA = 161, 338, 1.0
WORDS = ("the", "model", "serves", "tokens", "while", "a", "batch", "of", "requests", "waits", "for", "its", "turn",
         "and", "every", "step", "decodes", "one", "more", "word")


@dataclass(frozen=True)
class Lengths:
    """Token counts: lognormal (sigma = `spread`, the log's standard deviation), uniform (mean·(1 ± spread))
    or fixed at the mean; every draw clipped to [1, most]."""
    mean: float
    spread: float
    most: int
    kind: str = "lognormal"

    def __post_init__(self):
        if self.kind not in DISTRIBUTIONS:
            raise ValueError(f"unknown length distribution {self.kind!r}; choose one of {', '.join(DISTRIBUTIONS)}")
        if self.mean < 1 or self.most < 1 or self.spread < 0 or (self.kind == "uniform" and self.spread > 1):
            raise ValueError(f"lengths: mean {self.mean} and most {self.most} must be >= 1, spread {self.spread} "
                             ">= 0 (at most 1 for uniform)")

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.kind == "lognormal":
            x = rng.lognormal(math.log(self.mean) - self.spread ** 2 / 2, self.spread, n)   # mean = self.mean
        elif self.kind == "uniform":
            x = rng.uniform(self.mean * (1 - self.spread), self.mean * (1 + self.spread), n)
        else:
            x = np.full(n, self.mean)
        return np.clip(np.rint(x), 1, self.most).astype(int)


@dataclass
class LlmRecord:
    t_s: float                    # scheduled arrival, seconds from the start
    start_delay_s: float          # sent minus scheduled (the client's own lateness)
    ttft_s: float                 # sent -> first token event (nan when none came)
    e2e_s: float                  # sent -> last token event
    status: int                   # HTTP status, 0 when no answer
    prompt_tokens: int            # as sent (bytes of the prompt text; the chat template adds its own)
    max_tokens: int
    output_tokens: int            # tokens received: the usage event's count, else the token events
    gaps_s: list[float] = field(default_factory=list)   # between successive token events
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status == 200 and not self.error and self.output_tokens == self.max_tokens

    @property
    def tpot_s(self) -> float:
        """Time per output token after the first (DistServe's TPOT); nan for one token."""
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1) if self.output_tokens > 1 else math.nan


def prompt_text(rng: np.random.Generator, tokens: int) -> str:
    """Words, exactly `tokens` bytes long (the server's tokens are bytes)."""
    text = " ".join(rng.choice(WORDS, tokens // 2 + 1))
    return text[:tokens]


async def _read_stream(response: aiohttp.ClientResponse, record: LlmRecord, sent: float) -> None:
    """Times each event that carries choices; the tokens are those events, or the count a
    final usage event gives (OpenAI's stream_options include_usage), which is right where
    a server sends several tokens in one event (vLLM's API server, behind its engine)."""
    times, usage = [], None
    async for line in response.content:
        if not line.startswith(b"data: "):
            continue
        now, data = time.monotonic(), line[6:].strip()
        if data == b"[DONE]":
            break
        chunk = json.loads(data)
        if "error" in chunk:
            record.error = str(chunk["error"].get("message", ""))[:200]
            break
        if chunk.get("choices"):
            times.append(now)
        elif isinstance(chunk.get("usage"), dict):
            usage = chunk["usage"].get("completion_tokens")
    record.output_tokens = usage if isinstance(usage, int) else len(times)
    if times:
        record.ttft_s, record.e2e_s = times[0] - sent, times[-1] - sent
        record.gaps_s = [b - a for a, b in zip(times, times[1:])]


async def generate_llm_load(url: str, rate: float, duration_s: float, prompt: Lengths, output: Lengths,
                            model: str = "reference-decoder", profile: str = "constant", arrivals: str = "poisson",
                            burstiness: float = 0.25, max_inflight: int = 512, timeout_s: float = 60.0,
                            bad_share: float = 0.0, seed: int = 1, extra: dict | None = None) -> list[LlmRecord]:
    """Drive url (a server's /v1/completions or /v1/chat/completions) open loop with streaming requests;
    `bad_share` of them name an unknown model on purpose (an error answer); `extra`: more fields for
    every request's body (vLLM's {"ignore_eos": True}, so that each answer has its max_tokens). One
    record per arrival."""
    if not 0 <= bad_share <= 1:
        raise ValueError(f"bad_share={bad_share} must be in [0, 1]")
    chat = urlparse(url).path.rstrip("/").endswith("/chat/completions")
    times = schedule(rate, duration_s, profile, arrivals, burstiness, seed)
    rng = np.random.default_rng(seed)
    prompts, outputs = prompt.draw(rng, len(times)), output.draw(rng, len(times))
    bad = rng.random(len(times)) < bad_share
    texts = [prompt_text(rng, int(n)) for n in prompts]
    records: list[LlmRecord] = []

    async def one(session, i, t_s, t_abs):
        body = {"model": "no-such-model" if bad[i] else model, "max_tokens": int(outputs[i]), "stream": True,
                **({"messages": [{"role": "user", "content": texts[i]}]} if chat else {"prompt": texts[i]}),
                **(extra or {})}
        sent = time.monotonic()
        record = LlmRecord(t_s, sent - t_abs, math.nan, math.nan, 0, len(texts[i]), int(outputs[i]), 0)
        try:
            async with session.post(url, json=body) as r:
                record.status = r.status
                if r.status == 200:
                    await _read_stream(r, record, sent)
                else:
                    answer = await r.json(content_type=None)
                    record.error = str((answer.get("error") or {}).get("message", ""))[:200]
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
            record.error = f"{type(e).__name__}: {e}"[:200]
        records.append(record)

    def overflow(i, t_s):
        records.append(LlmRecord(t_s, math.nan, math.nan, math.nan, 0, len(texts[i]), int(outputs[i]), 0,
                                 error="overflow"))

    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=max_inflight), timeout=timeout) as session:
        await open_loop(times, max_inflight, lambda i, t_s, t_abs: one(session, i, t_s, t_abs), overflow)
    records.sort(key=lambda r: r.t_s)
    return records


def run_llm_load(url: str, rate: float, duration_s: float, prompt: Lengths, output: Lengths, **kwargs) -> list[LlmRecord]:
    """generate_llm_load from synchronous code (a fresh event loop)."""
    return asyncio.run(generate_llm_load(url, rate, duration_s, prompt, output, **kwargs))


def summarize_llm(records: list[LlmRecord], duration_s: float, slo_ttft_s: float | None = None,
                  slo_tpot_s: float | None = None) -> dict:
    """Rates, TTFT / inter-token gap / TPOT / e2e quantiles of completed requests, status counts, and
    goodput: completed requests per second that meet every SLO given (DistServe's definition)."""
    done = [r for r in records if r.ok]

    def q(xs, p):
        return float(np.quantile(xs, p)) if len(xs) else math.nan

    ttft = [r.ttft_s for r in done]
    gaps = [g for r in done for g in r.gaps_s]
    tpot = [r.tpot_s for r in done if r.output_tokens > 1]
    good = [r for r in done if (slo_ttft_s is None or r.ttft_s <= slo_ttft_s)
            and (slo_tpot_s is None or r.output_tokens < 2 or r.tpot_s <= slo_tpot_s)]
    statuses: dict[int, int] = {}
    for r in records:
        statuses[r.status] = statuses.get(r.status, 0) + 1
    return {"offered_rps": len(records) / duration_s, "completed_rps": len(done) / duration_s,
            "goodput_rps": len(good) / duration_s, "output_tokens_per_s": sum(r.output_tokens for r in done) / duration_s,
            "ttft_p50_s": q(ttft, 0.5), "ttft_p99_s": q(ttft, 0.99), "itl_p50_s": q(gaps, 0.5),
            "itl_p99_s": q(gaps, 0.99), "tpot_p50_s": q(tpot, 0.5), "tpot_p99_s": q(tpot, 0.99),
            "e2e_p50_s": q([r.e2e_s for r in done], 0.5), "e2e_p99_s": q([r.e2e_s for r in done], 0.99),
            "statuses": statuses, "errors": len(records) - len(done),
            "overflow": sum(r.error == "overflow" for r in records)}


def format_llm_summary(s: dict) -> str:
    def ms(key):
        return f"{s[key] * 1000:.1f}"

    return (f"offered {s['offered_rps']:.1f} req/s, completed {s['completed_rps']:.1f} req/s, goodput "
            f"{s['goodput_rps']:.1f} req/s, {s['output_tokens_per_s']:.0f} tokens/s\n"
            f"TTFT P50 {ms('ttft_p50_s')} ms P99 {ms('ttft_p99_s')} ms; inter-token P50 {ms('itl_p50_s')} ms "
            f"P99 {ms('itl_p99_s')} ms; TPOT P50 {ms('tpot_p50_s')} ms P99 {ms('tpot_p99_s')} ms; "
            f"e2e P50 {ms('e2e_p50_s')} ms P99 {ms('e2e_p99_s')} ms\n"
            f"statuses {s['statuses']}, errors {s['errors']} (overflow {s['overflow']})")
