"""The reference stack's capacity and latency per inference batch size, side by
side in one run: the oracle the batch tuner is judged against on this machine.

For each max_batch_size, in alternating order over --rounds rounds, through the
gateway (every query ends in one LLM call, so the inference server is the
bottleneck): capacity = answers/s with --clients closed-loop clients, and P50 /
P99 of an open-loop Poisson run at --rate. Medians over rounds are printed.

    python -m bench.stack_capacity [--batch-sizes 1,4,8,16] [--rounds 2] [--device auto]"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
from datetime import datetime, timezone

import numpy as np

from reference_stack import launcher
from reference_stack.client import StackClient
from reference_stack.loadgen import closed_loop, run_load, summarize
from reference_stack.model import ModelConfig


def batches(client) -> tuple[float, float]:
    """(batches run, requests in them) so far, from the inference server's histogram."""
    return (client.metric("inference", "inference_batch_size_count"),
            client.metric("inference", "inference_batch_size_sum"))


def mean_batch(client, before: tuple[float, float]) -> float:
    count, total = (now - then for now, then in zip(batches(client), before))
    return total / count if count else float("nan")


def measure(client, url: str, batch: int, args, seed: int) -> dict:
    client.patch("inference", max_batch_size=batch)
    before = batches(client)
    latencies = asyncio.run(closed_loop(url, args.clients, args.seconds, seed))
    out = {"capacity": len(latencies) / args.seconds, "sat_batch": mean_batch(client, before),
           "sat_p50": float(np.quantile(latencies, 0.5)), "sat_p99": float(np.quantile(latencies, 0.99))}
    before = batches(client)
    summary = summarize(run_load(url, args.rate, args.seconds, seed=seed), args.seconds)
    out.update(p50=summary["p50_s"], p99=summary["p99_s"], errors=summary["errors"], batch=mean_batch(client, before))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.stack_capacity", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-sizes", default="1,4,8,16")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=6.0, help="length of each closed and open run")
    parser.add_argument("--clients", type=int, default=32, help="closed-loop clients for the capacity run")
    parser.add_argument("--rate", type=float, default=20.0, help="open-loop offered rate, queries/s")
    parser.add_argument("--device", default="auto", help="inference device: auto, cpu, cuda")
    args = parser.parse_args(argv)
    sizes = [int(b) for b in args.batch_sizes.split(",")]

    with tempfile.TemporaryDirectory(prefix="stack-capacity-") as run_dir:
        cfg = launcher.StackConfig.on_free_ports(run_dir, inference_args=["--device", args.device])
        client = StackClient(launcher.start(cfg))
        try:
            device = client.http("POST", client.urls["inference"] + "/generate", {"prompt": "hi"})[1]["device"]
            url = client.state["query_url"]
            results: dict[int, list[dict]] = {b: [] for b in sizes}
            for r in range(args.rounds):
                for b in (sizes if r % 2 == 0 else sizes[::-1]):
                    results[b].append(measure(client, url, b, args, seed=100 * r + b))
                    print(f"  round {r + 1} batch {b}: {results[b][-1]['capacity']:.1f} req/s", flush=True)
        finally:
            launcher.stop(cfg.run_dir)

    med = {b: {k: statistics.median(x[k] for x in rs) for k in rs[0]} for b, rs in results.items()}
    m = ModelConfig()
    print(f"\nstack capacity, {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, device {device}, model d_model "
          f"{m.d_model} x {m.n_layers} layers, {m.max_new_tokens} new tokens, max_queue_delay_ms 5; "
          f"median of {args.rounds} alternating rounds of {args.seconds:g} s")
    rows = [("capacity, req/s", "capacity", 1), (f"  P50 ms at {args.clients} clients", "sat_p50", 1e3),
            (f"  P99 ms at {args.clients} clients", "sat_p99", 1e3),
            ("  mean batch size", "sat_batch", 1),
            (f"open loop {args.rate:g} req/s: P50 ms", "p50", 1e3), ("  P99 ms", "p99", 1e3),
            ("  mean batch size", "batch", 1), ("  errors", "errors", 1)]
    print(f"{'max_batch_size':<34}" + "".join(f"{b:>9}" for b in sizes))
    for label, key, scale in rows:
        print(f"{label:<34}" + "".join(f"{med[b][key] * scale:>9.1f}" for b in sizes))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
