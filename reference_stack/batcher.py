"""A dynamic batcher: requests wait until max_batch_size are queued or the
oldest has waited max_queue_delay_ms, then run together as one batch. One batch
runs at a time, in a worker thread, so the event loop keeps accepting."""
from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

from .settings import Settings


@dataclass
class Job:
    payload: Any
    arrived: float = field(default_factory=time.monotonic)
    future: asyncio.Future | None = None


@dataclass
class Done:
    result: Any
    queue_wait_s: float
    batch_size: int
    batch_compute_s: float


class Batcher:
    def __init__(self, settings: Settings, run_batch: Callable[[list[Any]], list[Any]],
                 on_batch: Callable[[int, float], None] | None = None):
        self.settings = settings
        self.run_batch = run_batch            # payloads -> results, same order; runs in the worker thread
        self.on_batch = on_batch              # (batch size, compute seconds), after each batch
        self.queue: list[Job] = []
        self.wake = asyncio.Event()
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="batch")
        self.task: asyncio.Task | None = None
        settings.on_change(lambda _changed: self.wake.set())

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        if self.task:
            self.task.cancel()
        self.executor.shutdown(wait=False, cancel_futures=True)

    async def submit(self, payload: Any) -> Done:
        job = Job(payload, future=asyncio.get_running_loop().create_future())
        self.queue.append(job)
        self.wake.set()
        return await job.future

    async def _take_batch(self) -> list[Job]:
        while True:
            if not self.queue:
                self.wake.clear()
                await self.wake.wait()
                continue
            size = self.settings["max_batch_size"]
            deadline = self.queue[0].arrived + self.settings["max_queue_delay_ms"] / 1000.0
            left = deadline - time.monotonic()
            if len(self.queue) >= size or left <= 0:
                batch, self.queue = self.queue[:size], self.queue[size:]
                return batch
            self.wake.clear()
            try:
                await asyncio.wait_for(self.wake.wait(), timeout=left)
            except asyncio.TimeoutError:
                pass

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._take_batch()
            started = time.monotonic()
            try:
                results = await loop.run_in_executor(self.executor, self.run_batch, [j.payload for j in batch])
            except Exception as e:              # a failed batch fails its requests, not the server
                for job in batch:
                    if not job.future.done():
                        job.future.set_exception(e)
                continue
            compute = time.monotonic() - started
            if self.on_batch:
                self.on_batch(len(batch), compute)
            for job, result in zip(batch, results):
                if not job.future.done():
                    job.future.set_result(Done(result, started - job.arrived, len(batch), compute))
