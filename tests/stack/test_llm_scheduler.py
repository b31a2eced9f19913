"""The LLM mode's arithmetic without a server: a ragged step over chunked
prefills and decodes gives the tokens a full recomputation gives, and the
scheduler keeps its budgets (sequences, tokens per step, KV cache) and its
orders (fcfs, priority, preempt the last)."""
from __future__ import annotations

import pytest
import torch

from reference_stack.llm.kv_cache import KVCache
from reference_stack.llm.scheduler import Scheduler, Sequence

from .test_model import generator, recompute  # noqa: F401  (the fixture and the no-cache reference)


@pytest.fixture(scope="module")
def model(generator):  # noqa: F811
    """test_model's sharp-weighted decoder (context 32 + 8 tokens)."""
    return generator.model


def serve(model, prompts: list[str], steps: int, max_num_seqs: int, budget: int, kv_tokens: int):
    """Run the scheduler and the ragged step to completion; (outputs, preemptions, step sizes)."""
    kv = KVCache(kv_tokens)
    sched = Scheduler(kv)
    seqs = [Sequence(i, list(p.encode()), steps, arrived=float(i)) for i, p in enumerate(prompts)]
    for s in seqs:
        sched.add(s)
    sizes, now = [], 10.0
    with torch.inference_mode():
        while sched.has_work():
            step = sched.schedule(max_num_seqs, budget, "fcfs", now)
            assert step.tokens <= budget and len(step.chunks) <= max_num_seqs and kv.used <= kv_tokens
            sizes.append((len(step.chunks), step.tokens))
            chunks = [torch.tensor(s.tokens()[start:start + n]) for s, start, n in step.chunks]
            logits, caches = model.step_ragged(chunks, [kv.get(s.id) for s, _, _ in step.chunks])
            for (s, _, _), layers in zip(step.chunks, caches):
                kv.store(s.id, layers)
            sched.finish_step(step, logits.argmax(-1).tolist(), now)
            now += 1
    return [s.output for s in seqs], sum(s.preemptions for s in seqs), sizes


PROMPTS = ["hi", "what is the weather in Paris", "compute 12 + 30", "x" * 20]


def test_ragged_steps_with_chunked_prefill_equal_recomputing_each_prompt(model, generator):  # noqa: F811
    want = [recompute(generator, p, 8) for p in PROMPTS]
    outputs, preemptions, sizes = serve(model, PROMPTS, 8, max_num_seqs=4, budget=6, kv_tokens=1000)
    assert outputs == want and preemptions == 0
    assert max(t for _, t in sizes) == 6          # the 28-token prompt was prefilled in chunks of at most 6


def test_preempted_sequences_recompute_to_the_same_tokens(model, generator):  # noqa: F811
    want = [recompute(generator, p, 8) for p in PROMPTS]
    outputs, preemptions, _ = serve(model, PROMPTS, 8, max_num_seqs=4, budget=64, kv_tokens=40)
    assert outputs == want and preemptions > 0


def test_max_num_seqs_bounds_the_batch_and_waiting_sequences_join_between_steps(model):
    _, _, sizes = serve(model, PROMPTS, 4, max_num_seqs=2, budget=64, kv_tokens=1000)
    assert max(n for n, _ in sizes) == 2
    assert sizes[0] == (2, 2 + 28)          # both prompts in one step, whole


def test_the_last_in_policy_order_is_preempted():
    kv = KVCache(10)
    sched = Scheduler(kv)
    old, new = Sequence(0, [1] * 4, 8, arrived=0.0), Sequence(1, [1] * 4, 8, arrived=1.0)
    sched.add(old)
    sched.add(new)
    step = sched.schedule(8, 100, "fcfs", 0.0)
    sched.finish_step(step, [5, 5], 0.0)     # 8 of 10 held; each now needs one more per step
    sched.finish_step(sched.schedule(8, 100, "fcfs", 1.0), [5, 5], 1.0)
    step = sched.schedule(8, 100, "fcfs", 2.0)
    assert step.preempted == [new] and [s for s, _, _ in step.chunks] == [old] and new.computed == 0
    assert sched.waiting == [new] and kv.used == old.computed + 1


def test_priority_orders_waiting_sequences_and_unknown_policies_are_named():
    sched = Scheduler(KVCache(100))
    low, high = Sequence(0, [1], 2, arrived=0.0, priority=5), Sequence(1, [1], 2, arrived=1.0, priority=0)
    sched.add(low)
    sched.add(high)
    assert [s for s, _, _ in sched.schedule(1, 100, "priority", 0.0).chunks] == [high]
    with pytest.raises(ValueError, match="scheduling_policy='lifo'; allowed: fcfs, priority"):
        sched.schedule(1, 100, "lifo", 0.0)
