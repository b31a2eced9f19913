"""Fit the continuous-batching step-time model, time(step) = a + b*tokens + c*seqs, on the
reference stack's own decoder (reference_stack/model.py, default ModelConfig) on this
machine, and print the fit with its residuals. bench/sim/continuous.py runs on these
coefficients; on a GPU they differ (run this there to get its own).

A step of `seqs` sequences with `tokens` tokens in all is timed as a server without a ragged
attention kernel runs it: one Decoder.step over the seqs-1 decoding sequences (one token
each, over a cache of CONTEXT tokens) and one over a prefill chunk of the rest.

    python -m bench.step_time_fit            # ~1 min
    python -m bench.step_time_fit --device cuda
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
import torch

from reference_stack.model import Decoder, ModelConfig, pick_device

CONTEXT = 32                               # cached tokens each decoding sequence attends over
SEQS = (1, 4, 16, 32, 64)
CHUNKS = (0, 8, 32, 64)                    # prefill tokens in the step (beside the decodes)


def _step(model: Decoder, cfg: ModelConfig, device, decodes: int, chunk: int):
    """A closure running one mixed step: the decodes over their caches, then the chunk."""
    dh = cfg.d_model // cfg.n_heads
    calls = []
    if decodes:
        caches = [(torch.randn(decodes, cfg.n_heads, CONTEXT, dh, device=device),) * 2 for _ in range(cfg.n_layers)]
        ids = torch.randint(1, 256, (decodes, 1), device=device)
        pos = torch.full((decodes, 1), CONTEXT, device=device)
        mask = torch.ones((decodes, 1, 1, CONTEXT + 1), dtype=torch.bool, device=device)
        calls.append((ids, pos, caches, mask))
    if chunk:
        ids = torch.randint(1, 256, (1, chunk), device=device)
        pos = torch.arange(chunk, device=device)[None]
        mask = torch.tril(torch.ones(chunk, chunk, dtype=torch.bool, device=device))[None, None]
        calls.append((ids, pos, [None] * cfg.n_layers, mask))

    def run():
        for ids, pos, caches, mask in calls:
            model.step(ids, pos, caches, mask)
        if device.type == "cuda":
            torch.cuda.synchronize()
    return run


def measure(device, repeats: int) -> list[tuple[int, int, float]]:
    """(tokens, seqs, median seconds) per grid point."""
    cfg = ModelConfig()
    torch.manual_seed(cfg.seed)
    model = Decoder(cfg).to(device).eval()
    out = []
    with torch.inference_mode():
        for seqs in SEQS:
            for chunk in CHUNKS:
                decodes = seqs - 1 if chunk else seqs
                run = _step(model, cfg, device, decodes, chunk)
                for _ in range(3):
                    run()
                times = []
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    run()
                    times.append(time.perf_counter() - t0)
                out.append((decodes + chunk, seqs, statistics.median(times)))
    return out


def fit(points: list[tuple[int, int, float]]) -> tuple[float, float, float]:
    """(a, b, c) by least squares on the relative error (each point weighted by 1/time)."""
    x = np.array([[1.0, t, s] for t, s, _ in points])
    y = np.array([d for _, _, d in points])
    coef, *_ = np.linalg.lstsq(x / y[:, None], np.ones_like(y), rcond=None)
    return tuple(float(c) for c in coef)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.step_time_fit", description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", help="cpu (default), cuda or auto")
    ap.add_argument("--repeats", type=int, default=30, help="timed runs per point (median kept)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    device = pick_device(args.device)
    points = measure(device, args.repeats)
    a, b, c = fit(points)
    print(f"step time on {device} ({torch.get_num_threads()} thread), default ModelConfig, context {CONTEXT}:")
    print(f"  a = {a * 1e3:.3f} ms, b = {b * 1e6:.2f} us/token, c = {c * 1e6:.2f} us/seq")
    print("| tokens | seqs | measured ms | fit ms | residual |\n|---|---|---|---|---|")
    worst = 0.0
    for t, s, d in points:
        model = a + b * t + c * s
        worst = max(worst, abs(model / d - 1))
        print(f"| {t} | {s} | {d * 1e3:.2f} | {model * 1e3:.2f} | {100 * (model / d - 1):+.0f} % |")
    print(f"largest residual {100 * worst:.0f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
