"""Rank every tuner policy on every scenario in closed-loop simulation (bench/sim) and
print one markdown table per tuner: median [IQR] over seeds (a column named mean: the mean),
primary metric marked.

    python -m bench.tuners            # full run (10 seeds), what the README quotes
    python -m bench.tuners --quick    # 3 short seeds, for a smoke test
"""
from __future__ import annotations

import argparse
import importlib
import multiprocessing
import sys
import time

import numpy as np

BENCHES = {"throttle": "throttle_bench", "batch": "batch_bench", "sampling": "sampling_bench",
           "breaker": "breaker_bench", "drift": "drift_bench", "budget": "budget_bench",
           "degrade": "degrade_bench", "fleet": "fleet_bench", "continuous_batch": "continuous_batch_bench"}


def bench_module(tuner: str):
    return importlib.import_module(f"bench.sim.{BENCHES[tuner]}")


def primary(mod, scenario: str) -> str:
    return mod.PRIMARY[scenario] if isinstance(mod.PRIMARY, dict) else mod.PRIMARY


def _job(args):
    tuner, policy, scenario, seed, quick = args
    return args, bench_module(tuner).run_one(policy, scenario, seed, quick)


def run(tuners, seeds: int, quick: bool, workers: int) -> dict:
    """{(tuner, scenario, policy): {metric: [values over seeds]}}"""
    jobs = [(t, p, s, seed, quick) for t in tuners for s in bench_module(t).SCENARIOS
            for p in bench_module(t).POLICIES for seed in range(seeds)]
    results: dict = {}
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        for (t, p, s, _, _), metrics in pool.imap_unordered(_job, jobs, chunksize=2):
            cell = results.setdefault((t, s, p), {})
            for k, v in metrics.items():
                cell.setdefault(k, []).append(v)
    return results


def _fmt(values, how: str = "median") -> str:
    v = np.asarray(values, float)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return "–"
    if how == "mean":
        return f"{v.mean():.2f}"
    q1, med, q3 = np.percentile(v, (25, 50, 75))
    digits = 0 if abs(med) >= 100 else 1 if abs(med) >= 10 else 3
    return f"{med:.{digits}f} [{q1:.{digits}f}–{q3:.{digits}f}]"


def columns(mod):
    """(metric key, label, "high"/"low" is better, "median" or "mean" over seeds) per table column."""
    return [(m + ("median",))[:4] for m in mod.METRICS]


def best_policy(mod, results, tuner: str, scenario: str) -> str:
    """The non-oracle policy with the best median of the primary metric; a tie goes to the best mean."""
    key = primary(mod, scenario)
    sign = 1 if next(d for m, _, d, _ in columns(mod) if m == key) == "high" else -1
    score = {p: tuple(sign * float(f(results[(tuner, scenario, p)][key])) for f in (np.nanmedian, np.nanmean))
             for p in mod.POLICIES if p != "oracle"}
    return max(score, key=score.get)


def table(tuner: str, results) -> str:
    mod = bench_module(tuner)
    head = ["scenario", "policy"] + [label for _, label, _, _ in columns(mod)]
    lines = [f"### {tuner}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in mod.SCENARIOS:
        best = best_policy(mod, results, tuner, s)
        for p in mod.POLICIES:
            cells = []
            for key, _, _, how in columns(mod):
                text = _fmt(results[(tuner, s, p)][key], how)
                cells.append(f"**{text}**" if key == primary(mod, s) and how == "median" else text)
            name = f"{p} ✓" if p == best else p
            lines.append("| " + " | ".join([s, name] + cells) + " |")
    lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.tuners", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="3 short seeds per cell (smoke test)")
    ap.add_argument("--seeds", type=int, help="seeds per cell (default 10, --quick 3)")
    ap.add_argument("--tuner", action="append", choices=list(BENCHES), help="only this tuner (repeatable)")
    ap.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    args = ap.parse_args(argv)
    seeds = args.seeds if args.seeds is not None else (3 if args.quick else 10)
    if seeds < 1:
        ap.error(f"--seeds must be at least 1, got {seeds}")
    tuners = args.tuner or list(BENCHES)
    start = time.perf_counter()
    results = run(tuners, seeds, args.quick, max(1, args.workers))
    print(f"slotune tuner ranking: median [IQR] over {seeds} seeds{' (quick)' if args.quick else ''}; "
          f"primary metric in bold, ✓ = best non-oracle policy on it (a tie on the median goes to the better mean)\n")
    for t in tuners:
        print(table(t, results))
    print(f"elapsed {time.perf_counter() - start:.0f} s with {args.workers} workers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
