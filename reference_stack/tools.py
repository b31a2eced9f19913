"""A tool server: POST /call {"args": {...}} answers {"tool", "result"} after a
latency drawn from a lognormal (median latency_ms, sigma latency_sigma), plus
tail_ms with probability tail_prob, and fails with HTTP 500 at failure_rate.
All four are settings, so faults can be injected at run time."""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import math
import random
import time

from aiohttp import web
from prometheus_client import Counter, Histogram

from .ports import port
from .service import common_arguments, json_error, load_settings, make_app, serve, token_file
from .settings import Setting

# The tools the gateway knows, with their default median latency in ms (ports: ports.py).
TOOLS = {"search": 40.0, "calculator": 5.0, "weather": 25.0}

REQUEST = Histogram("tool_request_duration_seconds", "time to answer a tool call", ["tool"],
                    buckets=(.001, .0025, .005, .01, .025, .05, .075, .1, .15, .25, .5, 1, 2.5, 5))
CALLS = Counter("tool_calls_total", "tool calls by outcome", ["tool", "outcome"])


def tool_settings(median_ms: float) -> list[Setting]:
    return [
        Setting("latency_ms", float, 0, 60000, median_ms, "median latency of a call"),
        Setting("latency_sigma", float, 0, 3, 0.3, "lognormal sigma of the latency"),
        Setting("tail_prob", float, 0, 1, 0.0, "probability that a call also waits tail_ms"),
        Setting("tail_ms", float, 0, 60000, 500.0, "extra latency of a tail call"),
        Setting("failure_rate", float, 0, 1, 0.0, "probability that a call fails with HTTP 500"),
    ]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--name", required=True, choices=sorted(TOOLS), help="which tool this process serves")
    common_arguments(parser, None)


def answer(tool: str, args: dict) -> object:
    """A deterministic result for the arguments, shaped like the real tool's."""
    digest = int(hashlib.sha256(json.dumps([tool, args], sort_keys=True).encode()).hexdigest()[:8], 16)
    if tool == "weather":
        return {"city": args.get("city", "?"), "temp_c": digest % 35 - 5, "sky": ["clear", "cloudy", "rain"][digest % 3]}
    if tool == "calculator":
        values = [float(v) for v in args.get("values", []) if isinstance(v, (int, float))]
        op = args.get("op", "sum")
        if not values:
            return {"op": op, "value": None}
        value = {"sum": sum(values), "mean": sum(values) / len(values),
                 "difference": values[0] - sum(values[1:]), "max": max(values)}.get(op, sum(values))
        return {"op": op, "value": round(value, 3)}
    return {"q": args.get("q", ""), "hits": [f"doc-{(digest >> s) % 997}" for s in (0, 7, 14)]}


def build_app(args) -> web.Application:
    args.port = args.port or port(args.name)
    settings = load_settings(tool_settings(TOOLS[args.name]), args)
    rng = random.Random()

    def draw_latency_s() -> float:
        s = settings.snapshot()
        ms = s["latency_ms"] * math.exp(rng.gauss(0, s["latency_sigma"])) if s["latency_ms"] > 0 else 0.0
        if rng.random() < s["tail_prob"]:
            ms += s["tail_ms"]
        return ms / 1000.0

    async def call(request: web.Request) -> web.Response:
        started = time.monotonic()
        try:
            body = await request.json()
            tool_args = body.get("args", {}) if isinstance(body, dict) else None
            if not isinstance(tool_args, dict):
                raise ValueError
        except ValueError:
            return json_error(400, 'the body must be JSON {"args": {...}}')
        await asyncio.sleep(draw_latency_s())
        failed = rng.random() < settings["failure_rate"]
        CALLS.labels(args.name, "error" if failed else "ok").inc()
        REQUEST.labels(args.name).observe(time.monotonic() - started)
        if failed:
            return json_error(500, f"{args.name}: injected failure (failure_rate={settings['failure_rate']})")
        return web.json_response({"tool": args.name, "result": answer(args.name, tool_args)})

    app = make_app("tool", settings, token_file(args))
    app.router.add_post("/call", call)
    return app


def run(args) -> int:
    serve(build_app(args), args.host, [(args.port, None)])
    return 0
