"""The iteration-level scheduler (continuous batching, as vLLM and Sarathi-Serve
run it): before every model step it picks which sequences run and how many of
their tokens, within max_num_seqs sequences and max_num_batched_tokens tokens
(a long prompt is prefilled in chunks beside the decodes), and preempts the
last sequence in scheduling order (recomputed later) when the KV cache is full.
Pure bookkeeping: no model, no threads, time comes in as arguments."""
from __future__ import annotations

from dataclasses import dataclass, field

from .kv_cache import KVCache

POLICIES = ("fcfs", "priority")


@dataclass(eq=False)
class Sequence:
    id: int
    prompt: list[int]
    max_tokens: int
    arrived: float
    priority: int = 0                 # lower runs first under the priority policy (vLLM's convention)
    output: list[int] = field(default_factory=list)
    computed: int = 0                 # tokens (prompt, then output) whose keys and values are cached
    first_scheduled: float | None = None
    token_times: list[float] = field(default_factory=list)
    finished: float | None = None
    finish_reason: str | None = None  # "length" when max_tokens are out, "abort" when the client left
    preemptions: int = 0

    def tokens(self) -> list[int]:
        return self.prompt + self.output

    def pending(self) -> int:
        """Tokens to run before the next token can be sampled: the rest of the prompt (and, after a
        preemption, of the output so far), or the last sampled token during decoding."""
        return len(self.prompt) + len(self.output) - self.computed


@dataclass
class Step:
    chunks: list[tuple[Sequence, int, int]]   # (sequence, first token index, token count) to run now
    preempted: list[Sequence]

    @property
    def tokens(self) -> int:
        return sum(n for _, _, n in self.chunks)


def order_key(policy: str):
    if policy == "priority":
        return lambda s: (s.priority, s.arrived, s.id)
    if policy == "fcfs":
        return lambda s: (s.arrived, s.id)
    raise ValueError(f"scheduling_policy={policy!r}; allowed: {', '.join(POLICIES)}")


class Scheduler:
    def __init__(self, kv: KVCache):
        self.kv = kv
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self, max_num_seqs: int, max_num_batched_tokens: int, policy: str, now: float) -> Step:
        """The next step. Running sequences go first, in policy order; when one needs more KV cache
        than is free, the last running sequence is preempted until it fits (or is itself the last).
        Waiting sequences join only in a step without preemption, while the batch has room."""
        key = order_key(policy)
        budget = max_num_batched_tokens
        chunks, preempted = [], []
        self.running.sort(key=key)
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(seq.pending(), budget)
            while not self.kv.fits(n) and self.running[-1] is not seq:
                preempted.append(self._preempt(self.running.pop()))
            if not self.kv.fits(n):
                preempted.append(self._preempt(self.running.pop()))
                continue
            chunks.append(self._take(seq, n))
            budget -= n
            i += 1
        if not preempted:
            self.waiting.sort(key=key)
            while self.waiting and len(self.running) < max_num_seqs and budget > 0:
                seq = self.waiting[0]
                n = min(seq.pending(), budget)
                if not self.kv.fits(n):        # a chunk joins whole or waits (no 1-token slivers that thrash)
                    break
                self.running.append(self.waiting.pop(0))
                if seq.first_scheduled is None:
                    seq.first_scheduled = now
                chunks.append(self._take(seq, n))
                budget -= n
        return Step(chunks, preempted)

    def _take(self, seq: Sequence, n: int) -> tuple[Sequence, int, int]:
        self.kv.reserve(seq.id, n)
        return seq, seq.computed, n

    def _preempt(self, seq: Sequence) -> Sequence:
        """Drop the sequence's cache; it waits again and recomputes its prompt and output so far."""
        self.kv.release(seq.id)
        seq.computed = 0
        seq.preemptions += 1
        self.waiting.append(seq)
        return seq

    def finish_step(self, step: Step, sampled: list[int], now: float) -> list[Sequence]:
        """Record a step's results: sampled[i] is the token after chunk i. Returns the sequences that
        got a new token; those whose max_tokens are out are finished and their cache freed."""
        got = []
        for (seq, _, n), token in zip(step.chunks, sampled):
            if seq.finished is not None or seq not in self.running:     # aborted while the step ran
                continue
            seq.computed += n
            if seq.pending():                                            # a prefill chunk, more to come
                continue
            seq.output.append(token)
            seq.token_times.append(now)
            got.append(seq)
            if len(seq.output) >= seq.max_tokens:
                self._end(seq, "length", now)
        return got

    def abort(self, seq: Sequence, now: float) -> None:
        if seq.finished is None:
            self._end(seq, "abort", now)

    def _end(self, seq: Sequence, reason: str, now: float) -> None:
        seq.finished, seq.finish_reason = now, reason
        self.kv.release(seq.id)
        for queue in (self.running, self.waiting):
            if seq in queue:
                queue.remove(seq)
