"""The gateway's three caches of tool results, looked up in order:
in-process LRU (exact query), Redis (SHA-256 of the query, TTL), and a vector
cache (nearest earlier query by cosine of embeddings, numpy)."""
from __future__ import annotations

import hashlib
import json
import logging
from collections import OrderedDict

import numpy as np
import redis.asyncio as aioredis

from .embedding import DIM

log = logging.getLogger("reference_stack.cache")


class LRUCache:
    def __init__(self, capacity: int = 500):
        self.capacity = capacity
        self.items: OrderedDict[str, object] = OrderedDict()

    def get(self, key: str):
        if key in self.items:
            self.items.move_to_end(key)
            return self.items[key]
        return None

    def put(self, key: str, value) -> None:
        self.items[key] = value
        self.items.move_to_end(key)
        while len(self.items) > self.capacity:
            self.items.popitem(last=False)

    def flush(self) -> None:
        self.items.clear()


class RedisCache:
    """Values as JSON under <prefix><sha256(query)> with a TTL. A Redis outage is a miss, logged once."""

    def __init__(self, url: str, ttl_s: int = 300, prefix: str = "slotune:tools:"):
        self.client = aioredis.Redis.from_url(url, socket_timeout=1.0, socket_connect_timeout=1.0)
        self.url, self.ttl_s, self.prefix = url, ttl_s, prefix
        self.healthy = True

    def key(self, query: str) -> str:
        return self.prefix + hashlib.sha256(query.encode()).hexdigest()

    def _failed(self, e: Exception) -> None:
        if self.healthy:
            log.warning("redis %s unavailable (%s); treating lookups as misses", self.url, e)
        self.healthy = False

    async def get(self, query: str):
        try:
            raw = await self.client.get(self.key(query))
        except (aioredis.RedisError, OSError) as e:
            self._failed(e)
            return None
        self.healthy = True
        return json.loads(raw) if raw is not None else None

    async def put(self, query: str, value) -> None:
        try:
            await self.client.set(self.key(query), json.dumps(value), ex=self.ttl_s)
        except (aioredis.RedisError, OSError) as e:
            self._failed(e)

    async def flush(self) -> None:
        async for key in self.client.scan_iter(match=self.prefix + "*", count=500):
            await self.client.delete(key)

    async def close(self) -> None:
        await self.client.aclose()


class VectorCache:
    """The most recent `capacity` (embedding, value) pairs in a ring; a lookup
    returns the nearest one's value when its cosine >= threshold."""

    def __init__(self, threshold: float = 0.91, capacity: int = 2000):
        self.threshold = threshold
        self.vectors = np.zeros((capacity, DIM), dtype=np.float32)
        self.values: list[object] = [None] * capacity
        self.count = 0

    def get(self, vector: np.ndarray):
        n = min(self.count, len(self.values))
        if n == 0:
            return None
        scores = self.vectors[:n] @ vector
        best = int(np.argmax(scores))
        return self.values[best] if scores[best] >= self.threshold else None

    def put(self, vector: np.ndarray, value) -> None:
        slot = self.count % len(self.values)
        self.vectors[slot] = vector
        self.values[slot] = value
        self.count += 1

    def flush(self) -> None:
        self.count = 0
        self.values = [None] * len(self.values)
