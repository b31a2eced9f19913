"""A web app slotune did not write, for the attribution matrix: FastAPI on uvicorn,
one worker, watched by eBPF only (it exports no metrics). POST /query reads a key
from the Redis at $REDIS_PORT (where set), spends about WORK_MS of CPU and answers;
POST /fault {"sleep_ms": N} makes every request then block the event loop for N ms
in a sleep syscall (a blocking call inside an async handler, the classic mistake).
Start: REDIS_PORT=R python -m uvicorn bench.thirdparty_app:app --port P"""
import hashlib
import os
import time

import redis.asyncio
from fastapi import FastAPI, Request

WORK_MS = 10.0      # about 90 requests a second fill its one worker
app = FastAPI()
state = {"sleep_ms": 0.0}
cache = redis.asyncio.Redis(port=int(os.environ["REDIS_PORT"])) if os.environ.get("REDIS_PORT") else None


def _spend_cpu(ms: float) -> str:
    end, digest = time.thread_time() + ms / 1e3, b"x"
    while time.thread_time() < end:
        digest = hashlib.sha256(digest).digest()
    return digest.hex()[:8]


@app.post("/query")
async def query(request: Request) -> dict:
    await request.body()
    if cache is not None:
        await cache.get("greeting")
    if state["sleep_ms"]:
        time.sleep(state["sleep_ms"] / 1e3)
    return {"answer": _spend_cpu(WORK_MS)}


@app.post("/fault")
async def fault(request: Request) -> dict:
    state["sleep_ms"] = float((await request.json()).get("sleep_ms", 0.0))
    return state
