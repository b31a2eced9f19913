"""Turns a tool-needing query into a DAG of tool calls and runs it: independent
lookups (weather per city, search per topic or sight) in parallel, at most
`parallel` at a time, then the calculator steps that combine their results."""
from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable

from .corpus import CITIES

_WEATHER = re.compile(r"\b(weather|rain|temperature|forecast|sunny)\b", re.I)
_SEARCH = re.compile(r"\b(search|find|news|latest|sights|who|how do)\b", re.I)
_COMBINE = re.compile(r"\b(compare|average|plus|sum|difference|trip)\b", re.I)
MAX_FANOUT = 4


@dataclass
class Node:
    id: str
    tool: str
    args: dict
    deps: list[str] = field(default_factory=list)


@dataclass
class Call:
    """What happened to one node: outcome is ok, error, timeout, rejected (breaker open) or skipped."""
    id: str
    tool: str
    args: dict
    outcome: str
    started_s: float
    ended_s: float
    result: object = None

    def as_json(self) -> dict:
        return {"id": self.id, "tool": self.tool, "args": self.args, "outcome": self.outcome,
                "started_s": round(self.started_s, 6), "ended_s": round(self.ended_s, 6), "result": self.result}


def plan(query: str) -> list[Node]:
    cities = [c for c in CITIES if re.search(rf"\b{c}\b", query, re.I)][:MAX_FANOUT]
    numbers = [float(n) for n in re.findall(r"\b\d+(?:\.\d+)?\b", query)]
    nodes: list[Node] = []
    if _WEATHER.search(query):
        nodes += [Node(f"weather:{c}", "weather", {"city": c}) for c in cities or ["here"]]
    if _SEARCH.search(query):
        if "sights" in query.lower() and cities:
            nodes += [Node(f"search:{c}", "search", {"q": f"top sights in {c}"}) for c in cities]
        else:
            nodes.append(Node("search", "search", {"q": query}))
    if _COMBINE.search(query):
        weather = [n.id for n in nodes if n.tool == "weather"]
        op = "mean" if re.search(r"average|trip", query, re.I) else (
            "difference" if re.search(r"compare|difference", query, re.I) else "sum")
        if weather and len(weather) > 1:
            nodes.append(Node("calculator", "calculator", {"op": op}, weather))
        elif numbers:
            nodes.append(Node("calculator", "calculator", {"op": op, "values": numbers}))
    return nodes or [Node("search", "search", {"q": query})]


async def run(nodes: list[Node], call_tool: Callable[[str, dict], Awaitable[tuple[str, object]]],
              parallel: int, t0: float) -> list[Call]:
    """Run every node once its deps are done; call_tool(tool, args) -> (outcome, result)."""
    gate = asyncio.Semaphore(parallel)
    done: dict[str, asyncio.Future] = {n.id: asyncio.get_running_loop().create_future() for n in nodes}

    async def one(node: Node) -> Call:
        deps = [await done[d] for d in node.deps]
        args = dict(node.args)
        if deps:
            if any(d.outcome != "ok" for d in deps):
                now = time.monotonic() - t0
                call = Call(node.id, node.tool, args, "skipped", now, now)
                done[node.id].set_result(call)
                return call
            args["values"] = [d.result["temp_c"] for d in deps]
        async with gate:
            started = time.monotonic() - t0
            outcome, result = await call_tool(node.tool, args)
            call = Call(node.id, node.tool, args, outcome, started, time.monotonic() - t0, result)
        done[node.id].set_result(call)
        return call

    return list(await asyncio.gather(*(one(n) for n in nodes)))
