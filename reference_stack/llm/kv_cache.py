"""The KV cache of the running sequences: each sequence's keys and values per
layer, and the token accounting against the cache's capacity (kv_cache_tokens)
that admission and preemption decide on."""
from __future__ import annotations


class KVCache:
    def __init__(self, capacity_tokens: int):
        if capacity_tokens < 1:
            raise ValueError(f"kv_cache_tokens={capacity_tokens} must be at least 1")
        self.capacity = capacity_tokens
        self.held: dict[int, int] = {}          # sequence id -> tokens it holds (cached or reserved for this step)
        self.layers: dict[int, list] = {}       # sequence id -> per-layer (k, v) tensors

    @property
    def used(self) -> int:
        return sum(self.held.values())

    @property
    def free(self) -> int:
        return self.capacity - self.used

    def usage_ratio(self) -> float:
        return self.used / self.capacity

    def fits(self, tokens: int) -> bool:
        return tokens <= self.free

    def reserve(self, seq_id: int, tokens: int) -> None:
        """Room for `tokens` more of the sequence's keys and values (the caller checked fits)."""
        self.held[seq_id] = self.held.get(seq_id, 0) + tokens

    def get(self, seq_id: int) -> list | None:
        return self.layers.get(seq_id)

    def store(self, seq_id: int, layers: list) -> None:
        if seq_id in self.held:                 # not freed (finished, preempted, aborted) meanwhile
            self.layers[seq_id] = layers

    def release(self, seq_id: int) -> None:
        self.held.pop(seq_id, None)
        self.layers.pop(seq_id, None)
