"""The inference model's arithmetic: decoding with the KV cache over a
left-padded batch gives the tokens a full recomputation of each prompt alone
gives, so batching changes speed, never answers."""
from __future__ import annotations

import pytest
import torch

from reference_stack.model import Generator, ModelConfig, pick_device


@pytest.fixture(scope="module")
def generator():
    """A small model with large weights: attention is sharp, so any leak from a pad or a stale
    cache entry flips greedy tokens (the served model's small init would hide it)."""
    torch.set_num_threads(1)
    g = Generator(ModelConfig(d_model=64, n_layers=2, n_heads=4, max_prompt_tokens=32, max_new_tokens=8),
                  torch.device("cpu"))
    with torch.no_grad():
        for p in g.model.parameters():
            if p.dim() > 1:
                p.normal_(std=0.3)
    return g


def recompute(generator: Generator, prompt: str, steps: int) -> list[int]:
    """Greedy tokens for one unpadded prompt, the whole sequence recomputed at each step, no cache."""
    ids = generator.encode(prompt)
    out = []
    with torch.inference_mode():
        for _ in range(steps):
            x = torch.tensor([ids + out])
            t = x.shape[1]
            mask = torch.tril(torch.ones(t, t, dtype=torch.bool))[None, None]
            logits, _ = generator.model.step(x, torch.arange(t)[None], [None] * generator.cfg.n_layers, mask)
            out.append(int(logits.argmax(-1)))
    return out


def test_batched_cached_decoding_equals_recomputing_each_prompt(generator):
    prompts = ["hi", "what is the weather in Paris", "compute the average of 12, 30 and 45 for me"]
    batched = generator.generate(prompts, [8, 8, 8])
    assert batched == [recompute(generator, p, 8) for p in prompts]


def test_each_request_gets_its_own_token_count(generator):
    out = generator.generate(["a", "bb", "ccc"], [1, 3, 8])
    assert [len(o) for o in out] == [1, 3, 8]
    assert len(generator.generate(["a"], [50])[0]) == 8          # capped by max_new_tokens


def test_same_seed_same_weights():
    cfg = ModelConfig(d_model=32, n_layers=1, n_heads=2)
    a, b = Generator(cfg, torch.device("cpu")), Generator(cfg, torch.device("cpu"))
    assert all(torch.equal(x, y) for x, y in zip(a.model.parameters(), b.model.parameters()))


def test_device_choice_is_explained():
    assert pick_device("cpu").type == "cpu"
    if not torch.cuda.is_available():
        assert pick_device("auto").type == "cpu"
        with pytest.raises(ValueError, match="--device cuda: torch sees no CUDA device"):
            pick_device("cuda")
    with pytest.raises(ValueError, match="multiple of n_heads"):
        ModelConfig(d_model=100, n_heads=8)
