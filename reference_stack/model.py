"""A small byte-level transformer decoder with a KV cache.

Weights come from a fixed seed, so the text is meaningless, but the compute is
the real shape of LLM inference: a batched prefill over padded prompts, then
one decode step per new token that attends over the cached keys and values;
or, for continuous batching, one step over a ragged batch (each sequence its
own cache and its own number of new tokens). Runs on CUDA when present, CPU
otherwise (the same code).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

VOCAB = 256          # byte-level: a token is one byte of UTF-8
PAD = 0


@dataclass(frozen=True)
class ModelConfig:
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 8
    max_prompt_tokens: int = 64
    max_new_tokens: int = 12
    seed: int = 1234

    def __post_init__(self):
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} must be a multiple of n_heads={self.n_heads}")


def pick_device(requested: str = "auto") -> torch.device:
    """'auto' takes the first CUDA device when torch sees one, else the CPU."""
    if requested == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    device = torch.device(requested)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {requested}: torch sees no CUDA device; use --device cpu or auto")
    return device


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(nn.Linear(cfg.d_model, 4 * cfg.d_model), nn.GELU(),
                                 nn.Linear(4 * cfg.d_model, cfg.d_model))

    def forward(self, x, cache, mask):
        """x: [B, T, D]; cache: (k, v) of [B, H, S, Dh] or None; mask: [B, 1, T, S+T] bool (True = attend)."""
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2) for z in (q, k, v))
        if cache is not None:
            k = torch.cat([cache[0], k], dim=2)
            v = torch.cat([cache[1], v], dim=2)
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self._mix(x, att.transpose(1, 2).reshape(b, t, d)), (k, v)

    def forward_ragged(self, x, lengths, caches):
        """x: [N, D], the new tokens of every sequence one after another (lengths[i] of sequence i);
        caches[i]: (k, v) of [H, S_i, Dh] or None. Each token attends over its own sequence only."""
        d = x.shape[1]

        def heads(z, t):
            return z.view(t, self.n_heads, d // self.n_heads).transpose(0, 1)

        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        outs, new_caches = [], []
        for qi, ki, vi, cache, t in zip(q.split(lengths), k.split(lengths), v.split(lengths), caches, lengths):
            qi, ki, vi = heads(qi, t), heads(ki, t), heads(vi, t)
            if cache is not None:
                ki, vi = torch.cat([cache[0], ki], dim=1), torch.cat([cache[1], vi], dim=1)
            s = ki.shape[1]
            mask = None if t == 1 else torch.ones(t, s, dtype=torch.bool, device=x.device).tril(diagonal=s - t)
            outs.append(F.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask).transpose(0, 1).reshape(t, d))
            new_caches.append((ki, vi))
        return self._mix(x, torch.cat(outs)), new_caches

    def _mix(self, x, att):
        """The residual projection of the attention output, then the MLP."""
        x = x + self.proj(att)
        return x + self.mlp(self.ln2(x))


class Decoder(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(VOCAB, cfg.d_model)
        self.pos = nn.Embedding(cfg.max_prompt_tokens + cfg.max_new_tokens, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, VOCAB, bias=False)

    def step(self, ids, positions, caches, mask):
        x = self.tok(ids) + self.pos(positions)
        new_caches = []
        for block, cache in zip(self.blocks, caches):
            x, kv = block(x, cache, mask)
            new_caches.append(kv)
        return self.head(self.ln(x[:, -1])), new_caches

    def step_ragged(self, chunks: list[torch.Tensor], caches: list[list | None]):
        """One step of a continuous batch: chunks[i] holds the new token ids (1-D) of sequence i, whose
        earlier tokens' keys and values are caches[i] (one (k, v) of [H, S_i, Dh] per layer; None when
        it has none). The token-wise layers run over all new tokens at once, attention per sequence.
        Returns the logits after each chunk's last token [B, VOCAB] and each sequence's caches."""
        lengths = [len(c) for c in chunks]
        starts = [0 if c is None else c[0][0].shape[1] for c in caches]
        ids = torch.cat(chunks)
        positions = torch.cat([torch.arange(s, s + t, device=ids.device) for s, t in zip(starts, lengths)])
        x = self.tok(ids) + self.pos(positions)
        per_seq = [c or [None] * len(self.blocks) for c in caches]
        new_caches: list[list] = [[] for _ in chunks]
        for layer, block in enumerate(self.blocks):
            x, kvs = block.forward_ragged(x, lengths, [c[layer] for c in per_seq])
            for out, kv in zip(new_caches, kvs):
                out.append(kv)
        last = torch.tensor(lengths, device=ids.device).cumsum(0) - 1
        return self.head(self.ln(x[last])), new_caches


class Generator:
    """Greedy generation for a batch of prompts; prompts are left-padded."""

    def __init__(self, cfg: ModelConfig, device: torch.device):
        torch.manual_seed(cfg.seed)
        self.cfg = cfg
        self.device = device
        model = Decoder(cfg)
        for name, p in model.named_parameters():     # GPT-2's scheme; LayerNorms keep 1 and 0
            if p.dim() > 1:
                nn.init.normal_(p, std=0.02 if "tok" not in name and "pos" not in name else 1.0)
            elif "ln" not in name:
                nn.init.zeros_(p)
        self.model = model.to(device).eval()         # drawn on the CPU: the same weights on every device

    def encode(self, prompt: str) -> list[int]:
        ids = list(prompt.encode("utf-8"))[-self.cfg.max_prompt_tokens:]
        return [i if i != PAD else 32 for i in ids] or [32]

    @staticmethod
    def decode(ids: list[int]) -> str:
        return "".join(chr(32 + i % 95) for i in ids)

    @torch.inference_mode()
    def generate(self, prompts: list[str], new_tokens: list[int]) -> list[list[int]]:
        """Generate new_tokens[i] tokens for prompts[i]; the batch runs max(new_tokens) steps."""
        encoded = [self.encode(p) for p in prompts]
        b, t = len(encoded), max(len(e) for e in encoded)
        steps = max(1, min(max(new_tokens), self.cfg.max_new_tokens))
        ids = torch.full((b, t), PAD, dtype=torch.long)
        for row, e in enumerate(encoded):
            ids[row, t - len(e):] = torch.tensor(e)
        ids = ids.to(self.device)
        real = ids != PAD                                        # [B, T] which slots hold tokens
        positions = (real.cumsum(1) - 1).clamp(min=0)
        causal = torch.tril(torch.ones(t, t, dtype=torch.bool, device=self.device))
        mask = causal[None, None] & real[:, None, None, :]
        mask |= torch.eye(t, dtype=torch.bool, device=self.device)[None, None]   # pads see themselves
        caches = [None] * self.cfg.n_layers
        logits, caches = self.model.step(ids, positions, caches, mask)
        out = torch.empty((b, steps), dtype=torch.long, device=self.device)
        next_pos = positions[:, -1:] + 1
        keep = real[:, None, None, :]
        for i in range(steps):
            nxt = logits.argmax(-1)
            out[:, i] = nxt
            if i == steps - 1:
                break
            keep = torch.cat([keep, torch.ones((b, 1, 1, 1), dtype=torch.bool, device=self.device)], dim=-1)
            logits, caches = self.model.step(nxt[:, None], next_pos, caches, keep)
            next_pos = next_pos + 1
        rows = out.tolist()
        return [row[:max(1, min(n, steps))] for row, n in zip(rows, new_tokens)]
