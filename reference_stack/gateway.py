"""The agent gateway: POST /query {"query"} passes the rate limit, the intent
gate, the three caches of tool results, the tool DAG (each tool behind a
breaker), then asks the LLM (directly or through the TLS sidecar), and answers
{"answer", "tools", "cache", "degraded", "trace_id"?}. The LLM is the inference
server's POST /generate, or, started with --inference-api openai (a server in
LLM mode), its streaming POST /v1/completions: then {"query", "stream": true}
streams the answer back token by token (server-sent events) and the gateway
times its own time to first token. Each tool call and the
LLM call run under a time budget (tool_timeout_ms, llm_timeout_ms). A failed,
timed-out or refused tool makes the answer degraded (HTTP 200), never a 500; so
does the dimmer, for its degrade_ratio share of the queries (no tool calls,
fewer tokens)."""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import time

import aiohttp
from aiohttp import web
from prometheus_client import Counter, Gauge, Histogram

from . import faults, planner
from .breaker import Breaker
from .caches import LRUCache, RedisCache, VectorCache
from .corpus import ENTITIES
from .embedding import embed
from .intent import IntentGate
from .ports import port
from .ratelimit import TokenBucket
from .service import LATENCY_BUCKETS, common_arguments, json_error, load_settings, make_app, serve, token_file
from .settings import Setting
from .tools import TOOLS
from .tracing import TraceSampler

PORT = port("gateway")
SETTINGS = [
    Setting("rate_limit_rps", float, 0, 10000, 0.0, "token-bucket admission rate; 0 = unlimited"),
    Setting("concurrency_limit", int, 0, 10000, 0, "most queries answered at once; more get 429; 0 = unlimited"),
    Setting("trace_sample_rate", float, 0, 1, 0.1, "share of requests whose trace is exported"),
    Setting("trace_keep_slower_than_s", float, 0, 600, 0.0,
            "also export every trace slower than this (tail-based keep); 0 = off. Error traces are always kept"),
    Setting("breaker_failure_threshold", float, 0, 1, 0.5,
            "failure ratio over a tool's last 20 calls (at least 5) above which its breaker opens"),
    Setting("breaker_consecutive_failures", int, 0, 1000, 0, "also open after this many failures in a row; 0 = off"),
    Setting("breaker_open_s", float, 0.1, 600, 5.0, "time a breaker stays open before one probe call"),
    Setting("intent_threshold", float, 0, 1, 0.82, "intent-gate probability at or above which tools are called"),
    Setting("blocking_io_ms", float, 0, 1000, 0.0,
            "fault: ms of blocking write+fsync+clock_nanosleep on the event-loop thread per request"),
    Setting("llm_via_sidecar", bool, 0, 1, False, "send the LLM call through the TLS sidecar"),
    # Per-hop time budgets (the budget tuner pushes them): a call still running at its budget is cut off.
    Setting("tool_timeout_ms", float, 1, 600000, 2000.0,
            "a tool call still running after this is cut off and counted as a timeout (the answer is degraded)"),
    Setting("llm_timeout_ms", float, 1, 600000, 30000.0,
            "an LLM call still running after this is cut off; the query fails with 502"),
    # The dimmer (the degrade tuner pushes its ratio): cheaper answers instead of refusals.
    Setting("degrade_ratio", float, 0, 1, 0.0,
            "share of the queries answered degraded: no tool calls (cached results or none) and "
            "degrade_max_tokens from the LLM; 0.25 degrades every 4th"),
    Setting("degrade_max_tokens", int, 1, 4096, 4,
            "max_new_tokens (openai API: max_tokens) asked of the LLM for a dimmed answer"),
]
INFERENCE_APIS = ("generate", "openai")
REQUEST = Histogram("gateway_request_duration_seconds", "time to answer a query", ["outcome"], buckets=LATENCY_BUCKETS)
TTFT = Histogram("gateway_time_to_first_token_seconds",
                 "a query's arrival to the LLM's first token reaching the gateway (openai API only)",
                 buckets=(.001, .0025, .005, .0075, .01, .015, .02, .03, .05, .075, .1, .15, .2, .3, .5, .75, 1,
                          1.5, 2, 3, 5, 10))
STAGE = Histogram("gateway_stage_duration_seconds", "time spent per stage of a query", ["stage"], buckets=LATENCY_BUCKETS)
CACHE = Counter("gateway_cache_requests_total", "tool-result cache lookups by the level that answered", ["level"])
DEGRADED = Counter("gateway_degraded_total", "answers given degraded (still 200), by why: dimmer or tools",
                   ["reason"])
TOOL_CALLS = Counter("gateway_tool_calls_total", "tool calls by outcome", ["tool", "outcome"])
TOOL_TIME = Histogram("gateway_tool_duration_seconds", "tool call time seen by the gateway", ["tool"], buckets=LATENCY_BUCKETS)
BREAKER_OPEN = Gauge("gateway_breaker_open", "1 while the tool's circuit breaker is open", ["tool"])
RATE_LIMITED = Counter("gateway_rate_limited_total", "queries refused by the rate limit")
CONCURRENCY_LIMITED = Counter("gateway_concurrency_limited_total", "queries refused by the concurrency limit")
TRACES = Counter("gateway_traces_total", "queries by whether their trace was sampled", ["sampled"])
INFLIGHT = Gauge("gateway_inflight_requests", "queries being answered now")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common_arguments(parser, PORT)
    env = os.environ.get
    parser.add_argument("--inference-url",
                        default=env("SLOTUNE_STACK_INFERENCE_URL", f"http://127.0.0.1:{port('inference')}"))
    parser.add_argument("--sidecar-url", default=env("SLOTUNE_STACK_SIDECAR_URL", f"https://127.0.0.1:{port('sidecar')}"))
    parser.add_argument("--cert", default=None, help="CA certificate the sidecar presents (default <run dir>/tls.crt)")
    parser.add_argument("--redis-url", default=env("SLOTUNE_STACK_REDIS_URL", f"redis://127.0.0.1:{port('redis')}/0"))
    parser.add_argument("--tool", action="append", default=[], metavar="NAME=URL",
                        help="where a tool lives (default http://127.0.0.1:<its port>; repeatable)")
    parser.add_argument("--parallel-tools", type=int, default=8, help="most tool calls in flight per query")
    parser.add_argument("--cache-ttl-s", type=int, default=300, help="Redis TTL of a cached tool result")
    parser.add_argument("--inference-api", choices=INFERENCE_APIS,
                        default=env("SLOTUNE_STACK_INFERENCE_API", "generate"),
                        help="generate: the inference server's POST /generate (its default mode); openai: its "
                             "streaming POST /v1/completions (a server started with --mode llm)")
    parser.add_argument("--llm-model", default="reference-decoder",
                        help="the model the openai API's requests name (the server's --served-model-name)")


def tool_urls(pairs: list[str]) -> dict[str, str]:
    urls = {name: f"http://127.0.0.1:{port(name)}" for name in TOOLS}
    for pair in pairs:
        name, sep, url = pair.partition("=")
        if not sep or name not in TOOLS:
            raise SystemExit(f"--tool {pair!r}: expected NAME=URL with NAME one of {', '.join(TOOLS)}")
        urls[name] = url.rstrip("/")
    return urls


class Dimmer:
    """Which queries the degrade_ratio degrades: the ratio adds up query by query, and
    each time it makes a whole one that query is degraded (0.25: every 4th), so the share
    is exact over any run of queries, never a coin toss."""

    def __init__(self):
        self.owed = 0.0

    def pick(self, ratio: float) -> bool:
        self.owed += ratio
        if self.owed < 1.0 - 1e-9:
            return False
        self.owed -= 1.0
        return True


class Gateway:
    def __init__(self, args, settings):
        self.args, self.settings = args, settings
        self.tools = tool_urls(args.tool)
        self.gate = IntentGate()
        self.lru = LRUCache(500)
        self.redis = RedisCache(args.redis_url, ttl_s=args.cache_ttl_s)
        self.vectors = VectorCache(0.91)
        self.breakers = {name: Breaker() for name in self.tools}
        self.bucket = TokenBucket()
        self.dimmer = Dimmer()
        self.tracer = TraceSampler(args.run_dir / f"gateway-{args.port}-traces.jsonl")
        self.inflight = 0
        self.scratch = args.run_dir / f"gateway-{args.port}.blocking"
        self.http: aiohttp.ClientSession | None = None
        self.tls: aiohttp.ClientSession | None = None
        for name in self.tools:
            BREAKER_OPEN.labels(name).set(0)
        for reason in ("dimmer", "tools"):
            DEGRADED.labels(reason)

    async def start(self) -> None:
        self.args.run_dir.mkdir(parents=True, exist_ok=True)
        self.http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=512))
        cert = self.args.cert or self.args.run_dir / "tls.crt"
        if os.path.exists(cert):
            ctx = ssl.create_default_context(cafile=str(cert))
            self.tls = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=512, ssl=ctx))

    async def stop(self) -> None:
        for session in (self.http, self.tls):
            if session:
                await session.close()
        await self.redis.close()

    async def call_tool(self, tool: str, args: dict) -> tuple[str, object]:
        breaker, now = self.breakers[tool], time.monotonic()
        if not breaker.allow(now, self.settings["breaker_open_s"]):
            TOOL_CALLS.labels(tool, "rejected").inc()
            return "rejected", None
        outcome, result = "ok", None
        budget = aiohttp.ClientTimeout(total=self.settings["tool_timeout_ms"] / 1000)
        try:
            async with self.http.post(f"{self.tools[tool]}/call", json={"args": args}, timeout=budget) as r:
                body = await r.json(content_type=None)
                if r.status == 200:
                    result = body["result"]
                else:
                    outcome = "error"
        except asyncio.TimeoutError:
            outcome = "timeout"
        except (aiohttp.ClientError, ValueError, KeyError):
            outcome = "error"
        ended = time.monotonic()
        breaker.record(outcome != "ok", ended, self.settings["breaker_failure_threshold"],
                       self.settings["breaker_consecutive_failures"])
        BREAKER_OPEN.labels(tool).set(1 if breaker.is_open else 0)
        TOOL_CALLS.labels(tool, outcome).inc()
        TOOL_TIME.labels(tool).observe(ended - now)
        return outcome, result

    async def cached_tools(self, query: str) -> tuple[str, dict | None]:
        """(level, tool results) from the first cache that has them, or ("miss", None)."""
        hit = self.lru.get(query)
        if hit is not None:
            return "lru", hit
        hit = await self.redis.get(query)
        if hit is not None:
            self.lru.put(query, hit)
            return "redis", hit
        hit = self.vectors.get(embed(query, ENTITIES))
        if hit is not None:
            self.lru.put(query, hit)                 # the same wording again is an LRU hit
            return "vector", hit
        return "miss", None

    async def remember(self, query: str, results: dict) -> None:
        self.lru.put(query, results)
        self.vectors.put(embed(query, ENTITIES), results)
        await self.redis.put(query, results)

    async def ask_llm(self, prompt: str, max_new_tokens: int | None = None, on_token=None) -> str:
        """The LLM's answer to prompt; with the openai API each token is passed to on_token as it comes."""
        via_sidecar = self.settings["llm_via_sidecar"]
        if via_sidecar and self.tls is None:
            raise RuntimeError(f"llm_via_sidecar is on but the certificate {self.args.cert or 'tls.crt'} is missing")
        session, base = (self.tls, self.args.sidecar_url) if via_sidecar else (self.http, self.args.inference_url)
        timeout = aiohttp.ClientTimeout(total=self.settings["llm_timeout_ms"] / 1000)
        if self.args.inference_api == "openai":
            return await self.stream_completion(session, base.rstrip("/"), prompt, max_new_tokens, on_token, timeout)
        ask = {"prompt": prompt} if max_new_tokens is None else {"prompt": prompt, "max_new_tokens": max_new_tokens}
        async with session.post(f"{base.rstrip('/')}/generate", json=ask, timeout=timeout) as r:
            body = await r.json(content_type=None)
            if r.status != 200:
                raise RuntimeError(f"LLM answered {r.status}: {body.get('error', body)}")
            return body["text"]

    async def stream_completion(self, session, base: str, prompt: str, max_tokens: int | None, on_token,
                                timeout) -> str:
        """POST /v1/completions with stream true (OpenAI's wire format): one `data:` event per token."""
        ask = {"model": self.args.llm_model, "prompt": prompt, "stream": True,
               **({} if max_tokens is None else {"max_tokens": max_tokens})}
        text = []
        async with session.post(f"{base}/v1/completions", json=ask, timeout=timeout) as r:
            if r.status != 200:
                body = await r.json(content_type=None)
                raise RuntimeError(f"LLM answered {r.status}: {(body.get('error') or {}).get('message', body)}")
            async for line in r.content:
                if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    raise RuntimeError(f"LLM failed mid-stream: {event['error'].get('message', event['error'])}")
                for choice in event.get("choices", ()):
                    text.append(choice["text"])
                    if on_token is not None:
                        await on_token(choice["text"])
        return "".join(text)

    async def answer(self, query: str, spans: dict, dimmed: bool, on_token=None) -> dict:
        """Tools (from a cache, else called), then the LLM. A dimmed query calls no tool:
        cached results or none, and degrade_max_tokens from the LLM."""
        t0 = time.monotonic()
        needs_tools = self.gate.probability(query) >= self.settings["intent_threshold"]
        spans["gate"] = time.monotonic() - t0
        level, results, calls = None, {}, []
        if needs_tools:
            t = time.monotonic()
            level, cached = await self.cached_tools(query)
            CACHE.labels(level).inc()
            spans["cache"] = time.monotonic() - t
            if cached is not None:
                results = cached
            elif not dimmed:
                t = time.monotonic()
                calls = await planner.run(planner.plan(query), self.call_tool, self.args.parallel_tools, t)
                spans["tools"] = time.monotonic() - t
                results = {c.id: c.result for c in calls if c.outcome == "ok"}
                if all(c.outcome == "ok" for c in calls):
                    await self.remember(query, results)
        t = time.monotonic()
        prompt = query + "\n" + json.dumps(results, separators=(",", ":")) if results else query
        text = await self.ask_llm(prompt, self.settings["degrade_max_tokens"] if dimmed else None, on_token)
        spans["llm"] = time.monotonic() - t
        reason = "dimmer" if dimmed else "tools" if any(c.outcome != "ok" for c in calls) else None
        if reason:
            DEGRADED.labels(reason).inc()
        return {"answer": text, "tools": [c.as_json() for c in calls], "cache": level, "degraded": reason is not None}

    async def handle(self, request: web.Request) -> web.StreamResponse:
        started = time.monotonic()
        faults.block_for(self.settings["blocking_io_ms"], self.scratch)
        if not self.bucket.admit(self.settings["rate_limit_rps"], time.monotonic()):
            RATE_LIMITED.inc()
            REQUEST.labels("rejected").observe(time.monotonic() - started)
            return json_error(429, f"rate limited at {self.settings['rate_limit_rps']} queries/s")
        limit = self.settings["concurrency_limit"]
        if limit and self.inflight >= limit:
            CONCURRENCY_LIMITED.inc()
            REQUEST.labels("rejected").observe(time.monotonic() - started)
            return json_error(429, f"concurrency limit: {limit} queries already in flight")
        try:
            body = await request.json()
            query, stream = body["query"].strip(), body.get("stream", False)
            if not query or not isinstance(stream, bool):
                raise ValueError
        except (ValueError, KeyError, TypeError, AttributeError):
            return json_error(400, 'the body must be JSON {"query": "<non-empty text>", "stream"?: true|false}')
        if stream and self.args.inference_api != "openai":
            return json_error(400, "stream: true needs the gateway started with --inference-api openai "
                                   "(an inference server in LLM mode)")
        trace_id = self.tracer.sample(self.settings["trace_sample_rate"])
        spans: dict[str, float] = {}
        sse: list[web.StreamResponse] = []        # the client's event stream, opened at the first token
        timed: list[float] = []

        async def on_token(token: str) -> None:
            if not timed:
                timed.append(time.monotonic() - started)
                TTFT.observe(timed[0])
                if stream:
                    sse.append(web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                                           "Cache-Control": "no-cache"}))
                    await sse[0].prepare(request)
            if sse:
                await sse[0].write(_event({"token": token}))
        INFLIGHT.inc()
        self.inflight += 1
        try:
            out = await self.answer(query, spans, self.dimmer.pick(self.settings["degrade_ratio"]), on_token)
        except (aiohttp.ClientError, asyncio.TimeoutError, RuntimeError, KeyError, ValueError) as e:
            elapsed = time.monotonic() - started
            REQUEST.labels("error").observe(elapsed)
            self.keep_trace(trace_id or self.tracer.new_id(), {"query": query, "outcome": "error",
                                                               "duration_s": elapsed, "stages": spans})
            message = f"the LLM call failed: {type(e).__name__}: {e}"
            if sse:                                # the stream is open: the error is its last event
                await sse[0].write(_event({"error": message}))
                await sse[0].write_eof()
                return sse[0]
            return json_error(502, message)
        finally:
            INFLIGHT.dec()
            self.inflight -= 1
        for stage, seconds in spans.items():
            STAGE.labels(stage).observe(seconds)
        outcome = "degraded" if out["degraded"] else "ok"
        elapsed = time.monotonic() - started
        REQUEST.labels(outcome).observe(elapsed)
        slow = self.settings["trace_keep_slower_than_s"]
        if trace_id is None and slow and elapsed > slow:
            trace_id = self.tracer.new_id()
        if trace_id:
            out["trace_id"] = trace_id
            self.keep_trace(trace_id, {"query": query, "outcome": outcome, "duration_s": elapsed,
                                       "stages": spans, "tools": out["tools"]})
        else:
            TRACES.labels("false").inc()
        if sse:                                    # the whole answer, as /query answers it, then [DONE]
            await sse[0].write(_event(out) + b"data: [DONE]\n\n")
            await sse[0].write_eof()
            return sse[0]
        return web.json_response(out)

    def keep_trace(self, trace_id: str, spans: dict) -> None:
        TRACES.labels("true").inc()
        self.tracer.export(trace_id, spans)

    async def flush(self, request: web.Request) -> web.Response:
        try:
            level = (await request.json()).get("level", "all")
        except (ValueError, AttributeError):
            level = None
        if level not in ("lru", "redis", "vector", "all"):
            return json_error(400, 'the body must be JSON {"level": "lru" | "redis" | "vector" | "all"}')
        if level in ("lru", "all"):
            self.lru.flush()
        if level in ("redis", "all"):
            await self.redis.flush()
        if level in ("vector", "all"):
            self.vectors.flush()
        return web.json_response({"flushed": level})


def _event(data: dict) -> bytes:
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


def build_app(args) -> web.Application:
    settings = load_settings(SETTINGS, args)
    gateway = Gateway(args, settings)
    app = make_app("gateway", settings, token_file(args), gateway.start, gateway.stop)
    app.router.add_post("/query", gateway.handle)
    app.router.add_post("/admin/cache/flush", app["admin_guard"](gateway.flush))
    return app


def run(args) -> int:
    serve(build_app(args), args.host, [(args.port, None)])
    return 0
