"""A FastAPI app that exports no metrics, for watching by eBPF only: GET /sleep
answers after SLEEP_S (await asyncio.sleep), GET /cache answers with one GET on
the Redis at 127.0.0.1:$REDIS_PORT (6379 if unset; redis-py's asyncio client, a pooled
connection). Start: python -m uvicorn tests.e2e.plain_app:app --port P --workers 1"""
import asyncio
import os

import redis.asyncio
from fastapi import FastAPI

SLEEP_S = 0.02
app = FastAPI()
cache = redis.asyncio.Redis(host="127.0.0.1", port=int(os.environ.get("REDIS_PORT", 6379)))


@app.get("/sleep")
async def sleep() -> dict:
    await asyncio.sleep(SLEEP_S)
    return {"slept_s": SLEEP_S}


@app.get("/cache")
async def cached() -> dict:
    value = await cache.get("greeting")
    return {"greeting": value.decode() if value is not None else None}
