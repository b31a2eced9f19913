"""The engine of the LLM mode: one worker thread that loops schedule -> one
ragged model step -> sample (greedy), and hands each new token to its request
through a callback; requests are added and aborted from the event loop."""
from __future__ import annotations

import itertools
import logging
import threading
import time
from typing import Callable

import torch

from ..model import Decoder
from ..paced import Pace
from ..settings import Settings
from .kv_cache import KVCache
from .metrics import LlmMetrics
from .scheduler import Scheduler, Sequence

log = logging.getLogger("reference_stack.llm")
PACED_TOKEN = 1          # what a paced step answers each sequence: any token of the vocabulary but none ends it

# on_token(token, finish_reason or None) for each token; on_token(None, error message) when the step failed.
TokenCallback = Callable[[int | None, str | None], None]


class Engine:
    def __init__(self, model: Decoder, device: torch.device, settings: Settings, kv_cache_tokens: int,
                 metrics: LlmMetrics, pace: Pace | None = None):
        self.model = model
        self.pace = pace                  # set: a step is slept by a clock (paced.py), the model is not run
        self.device = device
        self.settings = settings
        self.kv = KVCache(kv_cache_tokens)
        self.scheduler = Scheduler(self.kv)
        self.metrics = metrics
        self.callbacks: dict[int, TokenCallback] = {}
        self.ids = itertools.count()
        self.work = threading.Condition()
        self.stopping = False
        self.thread = threading.Thread(target=self._loop, name="llm-engine", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        with self.work:
            self.stopping = True
            self.work.notify()
        self.thread.join(timeout=10)

    def submit(self, prompt: list[int], max_tokens: int, priority: int, on_token: TokenCallback) -> Sequence:
        seq = Sequence(next(self.ids), prompt, max_tokens, time.monotonic(), priority)
        with self.work:
            self.callbacks[seq.id] = on_token
            self.scheduler.add(seq)
            self.metrics.waiting.set(len(self.scheduler.waiting))
            self.work.notify()
        return seq

    def abort(self, seq: Sequence) -> None:
        """The client is gone: free the sequence's place and cache (nothing when it already finished)."""
        with self.work:
            if seq.finished is None:
                self.scheduler.abort(seq, time.monotonic())
                self.metrics.on_finish(seq)
                self.metrics.on_state(len(self.scheduler.running), len(self.scheduler.waiting),
                                      self.kv.usage_ratio())
            self.callbacks.pop(seq.id, None)

    def _loop(self) -> None:
        while True:
            with self.work:
                while not self.scheduler.has_work() and not self.stopping:
                    self.work.wait()
                if self.stopping:
                    return
                s = self.settings
                step = self.scheduler.schedule(s["max_num_seqs"], s["max_num_batched_tokens"],
                                               s["scheduling_policy"], time.monotonic())
                work = [(seq.tokens()[start:start + n], self.kv.get(seq.id)) for seq, start, n in step.chunks]
                if not work:                   # nothing fits this instant; the next submit or abort wakes us
                    self.work.wait(timeout=0.01)
                    continue
            try:
                sampled, caches = self._run(work)
            except Exception as e:             # a failed step fails its requests, not the server
                log.exception("model step failed")
                self._fail(step.chunks, f"the model step failed: {type(e).__name__}: {e}")
                continue
            with self.work:
                for (seq, _, _), layers in zip(step.chunks, caches):
                    self.kv.store(seq.id, layers)
                got = self.scheduler.finish_step(step, sampled, time.monotonic())
                self.metrics.on_step(step, len(self.scheduler.running), len(self.scheduler.waiting),
                                     self.kv.usage_ratio())
                calls = []
                for seq in got:
                    self.metrics.on_token(seq)
                    done = seq.finished is not None
                    if done:
                        self.metrics.on_finish(seq)
                    callback = self.callbacks.pop(seq.id) if done else self.callbacks.get(seq.id)
                    if callback:
                        calls.append((callback, seq.output[-1], seq.finish_reason))
            for callback, token, reason in calls:
                callback(token, reason)

    @torch.inference_mode()
    def _run(self, work: list[tuple[list[int], list | None]]) -> tuple[list[int], list]:
        if self.pace is not None:
            self.pace.step(len(work))
            return [PACED_TOKEN] * len(work), [None] * len(work)
        chunks = [torch.tensor(ids, dtype=torch.long, device=self.device) for ids, _ in work]
        logits, caches = self.model.step_ragged(chunks, [layers for _, layers in work])
        sampled = logits.argmax(-1).tolist()          # waits for the device
        if self.metrics.gpu_memory is not None:
            self.metrics.gpu_memory.set(torch.cuda.memory_reserved(self.device))
        return sampled, caches

    def _fail(self, chunks, message: str) -> None:
        with self.work:
            calls = []
            for seq, _, _ in chunks:
                self.scheduler.abort(seq, time.monotonic())
                self.metrics.on_finish(seq)
                callback = self.callbacks.pop(seq.id, None)
                if callback:
                    calls.append(callback)
        for callback in calls:
            callback(None, message)
