"""What tuning buys on the real stack: the reference stack and a real `slotune run`
on this machine under constant overloads, the demo's load step and a diurnal day,
four arms run alternately, each on a fresh stack (its own Redis, empty caches):

  shipped     the settings the stack ships with (no limit, no dimmer), no daemon
  whitepaper  the daemon with every tuner on `policy = "whitepaper"`
  slotune     the daemon with slotune's policies
(the daemon's tuners: the gateway's throttle, dimmer and sampling rate; with
`--batch-tuner` the inference server's batch size too, which every arm otherwise keeps at 8,
as the oracle's sweep does: a static arm's batch is not swept, so a tuned one is not compared)
  oracle      the best static settings for that profile, from a short sweep of it run
              before the rounds, no daemon (the table says them: concurrency limit, ratio)

The inference server is paced (PACE: each token step slept by a clock), so its
capacity C is known and the same on any host, and 1.5x is 1.5x: 20 s at 0.5 C, then
0.8, 1.2, 1.5, 2 or 3 C (`1.5x`); the step 0.5 C -> 1.5 C -> 0.5 C; the day
0.18 C - 1.62 C. `--cpu` runs the CPU model instead, C measured as the demo does.

Per arm, from the load generator's own records: the share answered within the SLO
with a degraded answer counting half (the primary figure), seconds whose P99
(answers completed in that second) is over the SLO, goodput (answered within the
SLO per second, a degraded answer counting in full), refused (429) and degraded
shares, errors, and the client-side P50/P99. Medians over the rounds with [min-max].

    python -m bench.closed_loop                 # 3 rounds x 4 arms x 7 profiles
    python -m bench.closed_loop --quick         # 1 round of short phases and a 2-point sweep, a smoke run
    python -m bench.closed_loop --profiles 1.5x,step --rounds 5 --json /tmp/closed_loop.json
    python -m bench.closed_loop --arms whitepaper,slotune,oracle   # without the shipped settings' arm
    python -m bench.closed_loop --profiles 1.5x --oracle 16,0      # that oracle, no sweep
    python -m bench.closed_loop --batch-tuner                      # the daemon's arms tune the batch size too

Needs root (the daemon's eBPF probes)."""
from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from slotune.demo.run import GATEWAY_SLO_MS, INFERENCE_SLO_MS, measure_capacity, phases, start_daemon  # noqa: E402
from slotune.demo.stack_config import DEMO_STACK_SETTINGS, for_reference_stack  # noqa: E402
from reference_stack import launcher, loadgen  # noqa: E402
from reference_stack.client import StackClient  # noqa: E402
from reference_stack.paced import Pace  # noqa: E402

SLO_S = GATEWAY_SLO_MS / 1e3
ARMS = ("shipped", "whitepaper", "slotune", "oracle")
LEVELS = {"0.8x": 0.8, "1.2x": 1.2, "1.5x": 1.5, "2x": 2.0, "3x": 3.0}
PROFILES = (*LEVELS, "step", "diurnal")
DIURNAL_MEAN = 0.9          # x capacity: the day swings 0.18..1.62 x capacity
# Paced inference: each token step 10 ms + 1 ms a sequence, 5 % jitter. At batch 8 and 12-token
# answers C = 37 answers/s, so 3 C stays within what this machine's gateway and load generator carry.
PACE = "10,1,0.05"
BATCH, ANSWER_TOKENS = 8, 12
# The whitepaper's token bucket starts open: twice the capacity, above the step's 1.5 x.
WHITEPAPER_START_X = 2.0
ORACLE_GRID = {"concurrency_limit": (8, 16, 32), "degrade_ratio": (0.0, 0.5, 1.0), "max_batch_size": (8,)}
QUICK_GRID = {"concurrency_limit": (16,), "degrade_ratio": (0.0, 1.0), "max_batch_size": (8,)}


def tuners_toml(policy: str, batch: bool) -> tuple[str, str]:
    """The gateway's and the inference server's tuner tables, every tuner on `policy`
    (batch: with the inference server's batch tuner; without, its batch size stays 8)."""
    def table(service: str, tuner: str, interval_s: float, extra: str = "") -> str:
        return f'[services.{service}.tuners.{tuner}]\npolicy = "{policy}"\ninterval_s = {interval_s}\n{extra}'
    return (table("gateway", "throttle", 1.0) + table("gateway", "degrade", 1.0)
            + table("gateway", "sampling", 5.0, "budget_traces_per_s = 2.0\n"),
            table("inference", "batch", 5.0) if batch else "")


@dataclass
class Run:
    """One arm on one profile in one round."""
    arm: str
    profile: str
    round: int
    records: list          # (seconds from the load's start, loadgen.Record)
    seconds: float
    trace: list            # the stack's settings each second: {t, concurrency_limit, rate_limit_rps, ...}
    decisions: int = 0


def plan(profile: str, capacity: float, quick: bool) -> list[tuple[float, float, str]]:
    """(rate, seconds, loadgen profile) segments: 20 s at half capacity then a level, the
    demo's step at 0.2 of its length, or one day."""
    if profile in LEVELS:
        return [(0.5 * capacity, 10.0 if quick else 20.0, "constant"),
                (LEVELS[profile] * capacity, 20.0 if quick else 40.0, "constant")]
    if profile == "step":
        return [(p.rate, p.seconds, "constant") for p in phases(capacity, 0.1 if quick else 0.2)]
    return [(DIURNAL_MEAN * capacity, 16.0 if quick else 33.0, "diurnal")]


def drive(url: str, segments, seed: int) -> list:
    out, offset = [], 0.0
    for rate, seconds, profile in segments:
        for r in loadgen.run_load(url, rate, seconds, profile=profile, seed=seed):
            out.append((offset + r.t_s, r))
        offset += seconds
    return out


def watch(client: StackClient, stop: threading.Event, trace: list) -> None:
    t0 = time.time()
    while not stop.wait(1.0):
        try:
            g, i = client.settings("gateway"), client.settings("inference")
        except OSError:
            continue
        trace.append({"t": round(time.time() - t0, 1), **{k: g[k] for k in ("concurrency_limit", "rate_limit_rps",
                                                                             "degrade_ratio")},
                      "max_batch_size": i["max_batch_size"]})


def stop_daemon(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def run_arm(arm: str, profile: str, rnd: int, capacity: float, oracle: dict, quick: bool, work: Path,
            inference_args: list[str], batch_tuner: bool) -> Run:
    """A fresh stack with the arm's settings (and daemon), the profile's load, then both stopped."""
    policy = {"whitepaper": "whitepaper", "slotune": "slotune"}.get(arm)
    settings = {"oracle": {"gateway": {k: v for k, v in oracle.items() if k != "max_batch_size"},
                           "inference": {"max_batch_size": oracle.get("max_batch_size", 8)}},
                "slotune": DEMO_STACK_SETTINGS,
                "whitepaper": {"gateway": {"rate_limit_rps": round(WHITEPAPER_START_X * capacity, 1)}}}.get(arm, {})
    run_dir = work / f"{profile}-{arm}-{rnd}"
    cfg = launcher.StackConfig.on_free_ports(run_dir / "stack", settings=settings, inference_args=inference_args)
    state = launcher.start(cfg)
    daemon, trace, stop = None, [], threading.Event()
    try:
        if policy:
            port = launcher.free_ports(1)[0]
            gateway_tuners, inference_tuners = tuners_toml(policy, batch_tuner)
            config_path = run_dir / "slotune.toml"
            config_path.write_text(for_reference_stack(state, port, run_dir, gateway_slo_ms=GATEWAY_SLO_MS,
                                                       inference_slo_ms=INFERENCE_SLO_MS, environment="bench",
                                                       gateway_tuners=gateway_tuners,
                                                       inference_tuners=inference_tuners))
            daemon = start_daemon(config_path, run_dir, f"http://127.0.0.1:{port}", dry_run=False)
        watcher = threading.Thread(target=watch, args=(StackClient(state), stop, trace), daemon=True)
        watcher.start()
        segments = plan(profile, capacity, quick)
        records = drive(state["query_url"], segments, seed=rnd)
        stop.set()
        watcher.join(timeout=5)
    finally:
        if daemon is not None:
            stop_daemon(daemon)
        launcher.stop(cfg.run_dir)
    audit = run_dir / "audit.jsonl"
    decisions = sum(json.loads(line)["outcome"] == "pushed" for line in audit.read_text().splitlines() if line) \
        if audit.exists() else 0
    return Run(arm, profile, rnd, records, sum(s for _, s, _ in segments), trace, decisions)


def figures(run: Run) -> dict:
    """The arm's figures from the client's records (latency from the scheduled arrival)."""
    recs = [r for _, r in run.records]
    n = max(len(recs), 1)
    answered = [(t + r.latency_s, r) for t, r in run.records if r.outcome in ("ok", "degraded")]
    lat = np.array([r.latency_s for _, r in answered])
    within = [r for _, r in answered if r.latency_s <= SLO_S]
    by_second: dict[int, list[float]] = {}
    for done, r in answered:
        by_second.setdefault(int(done), []).append(r.latency_s)
    over = sum(float(np.quantile(v, 0.99)) > SLO_S for s, v in by_second.items() if s < run.seconds)
    q = (lambda p: float(np.quantile(lat, p))) if len(lat) else (lambda p: math.nan)
    return {"over_s": int(over), "goodput_rps": len(within) / run.seconds,
            "within_half": sum(0.5 if r.outcome == "degraded" else 1.0 for r in within) / n,
            "refused": sum(r.outcome == "rejected" for r in recs) / n,
            "degraded": sum(r.outcome == "degraded" for r in recs) / n,
            "errors": sum(r.outcome == "error" for r in recs) / n,
            "p50_ms": q(0.5) * 1e3, "p99_ms": q(0.99) * 1e3, "offered": len(recs), "answered_rps": len(lat) / run.seconds,
            "pushed": run.decisions, "lowest_limit": min((s["concurrency_limit"] for s in run.trace), default=0),
            "mean_ratio": float(np.mean([s["degrade_ratio"] for s in run.trace])) if run.trace else 0.0}


def sweep(client: StackClient, capacity: float, grid: dict, profile: str, quick: bool) -> tuple[dict, list]:
    """Each static point of the grid under the profile's load, shortened to a third, on one
    stack; the best by the share within the SLO, a degraded answer counting half."""
    names, scores = list(grid), []
    segments = [(rate, seconds / 3, shape) for rate, seconds, shape in plan(profile, capacity, quick)]
    for values in itertools.product(*grid.values()):
        point = dict(zip(names, values))
        client.patch("gateway", **{k: v for k, v in point.items() if k != "max_batch_size"})
        client.patch("inference", max_batch_size=point["max_batch_size"])
        client.admin("gateway", "POST", {"level": "all"}, path="/admin/cache/flush")   # each point from cold caches
        time.sleep(1.0)
        records = drive(client.state["query_url"], segments, seed=7)
        f = figures(Run("oracle", "sweep", 0, records, sum(s for _, s, _ in segments), []))
        scores.append((f["within_half"], point, f))
        print(f"    {profile:<8} {point}: within SLO (degraded = 1/2) {f['within_half']:.3f}, refused "
              f"{f['refused']:.2f}, degraded {f['degraded']:.2f}, P99 {f['p99_ms']:.0f} ms", flush=True)
    best = max(scores, key=lambda s: s[0])
    return best[1], [{"point": p, **f} for _, p, f in scores]


def spread(values: list[float], fmt: str) -> str:
    med = float(np.median(values))
    if len(values) == 1:
        return format(med, fmt)
    return f"{format(med, fmt)} [{format(min(values), fmt)}–{format(max(values), fmt)}]"


def table(results: list[dict], oracles: dict) -> str:
    cols = [("within SLO (deg. = ½)", "within_half", ".2f"), ("s P99>SLO", "over_s", ".0f"),
            ("goodput q/s", "goodput_rps", ".1f"), ("refused", "refused", ".2f"),
            ("degraded", "degraded", ".2f"), ("errors", "errors", ".2f"), ("P50 ms", "p50_ms", ".0f"),
            ("P99 ms", "p99_ms", ".0f")]
    lines = ["| profile | arm | " + " | ".join(c[0] for c in cols) + " |",
             "|---|---|" + "---:|" * len(cols)]
    for profile in PROFILES:
        for arm in ARMS:
            rows = [r for r in results if r["profile"] == profile and r["arm"] == arm]
            if rows:
                o = oracles[profile]
                name = f"oracle ({o['concurrency_limit']}, {o['degrade_ratio']:g})" if arm == "oracle" else arm
                lines.append(f"| {profile} | {name} | " + " | ".join(spread([r[k] for r in rows], f)
                                                                     for _, k, f in cols) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="rounds of every arm on every profile (default 3)")
    ap.add_argument("--profiles", default=",".join(PROFILES), help="comma-separated: step, diurnal")
    ap.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of {', '.join(ARMS)}")
    ap.add_argument("--cpu", action="store_true",
                    help="the CPU model instead of the paced server, its capacity measured as the demo does")
    ap.add_argument("--capacity", type=float, default=None,
                    help="queries/s taken as 1x (default: the paced server's, or with --cpu measured)")
    ap.add_argument("--quick", action="store_true", help="1 round of short phases and a 2-point sweep")
    ap.add_argument("--json", type=Path, default=None, help="write every round's figures and settings here")
    ap.add_argument("--oracle", default=None, metavar="LIMIT,RATIO",
                    help="the oracle's concurrency limit and degrade ratio for every profile, no sweep")
    ap.add_argument("--batch-tuner", action="store_true",
                    help="the daemon's arms run the inference server's batch tuner too (by default every arm "
                         "keeps batch 8, as the oracle's sweep does)")
    args = ap.parse_args(argv)
    given = None
    if args.oracle:
        try:
            limit, ratio = (float(v) for v in args.oracle.split(","))
        except ValueError:
            ap.error(f"--oracle {args.oracle!r}: give LIMIT,RATIO, e.g. 16,0")
        given = {"concurrency_limit": int(limit), "degrade_ratio": ratio, "max_batch_size": 8}
    profiles = [p for p in args.profiles.split(",") if p]
    if bad := [p for p in profiles if p not in PROFILES]:
        ap.error(f"--profiles: unknown {', '.join(bad)}; choose from {', '.join(PROFILES)}")
    arms = tuple(a for a in ARMS if a in args.arms.split(","))
    if bad := [a for a in args.arms.split(",") if a not in ARMS]:
        ap.error(f"--arms: unknown {', '.join(bad)}; choose from {', '.join(ARMS)}")
    rounds = 1 if args.quick else args.rounds
    started, load_before = datetime.now(timezone.utc), os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="slotune-closed-loop-"))
    inference_args = [] if args.cpu else ["--paced", PACE]
    print(f"==> calibration stack in {work}", flush=True)
    cfg = launcher.StackConfig.on_free_ports(work / "calibration", inference_args=inference_args)
    state = launcher.start(cfg)
    oracles, swept = {}, {}
    try:
        capacity = args.capacity or (measure_capacity(state["query_url"]) if args.cpu
                                     else Pace.parse(PACE).capacity(BATCH, ANSWER_TOKENS))
        print(f"    capacity {capacity:.1f} queries/s ({'measured' if args.cpu else 'paced'}); "
              f"{'the oracle as given' if given else 'sweeping the static settings per profile'}", flush=True)
        for profile in profiles:
            oracles[profile], swept[profile] = (given, []) if given else sweep(
                StackClient(state), capacity, QUICK_GRID if args.quick else ORACLE_GRID, profile, args.quick)
    finally:
        launcher.stop(cfg.run_dir)
    print(f"    oracles: {oracles}", flush=True)
    results, runs = [], []
    for rnd, profile in itertools.product(range(rounds), profiles):
        order = arms[rnd % len(arms):] + arms[:rnd % len(arms)]      # each arm in each slot in turn
        for arm in order:
            t = time.monotonic()
            run = run_arm(arm, profile, rnd, capacity, oracles[profile], args.quick, work, inference_args,
                          batch_tuner=args.batch_tuner)
            f = {"arm": arm, "profile": profile, "round": rnd, **figures(run)}
            results.append(f)
            runs.append({**f, "settings": run.trace})
            print(f"    round {rnd + 1} {profile:<8} {arm:<10} {time.monotonic() - t:4.0f} s: over {f['over_s']} s, "
                  f"goodput {f['goodput_rps']:.1f} q/s, refused {f['refused']:.2f}, degraded {f['degraded']:.2f}, "
                  f"P99 {f['p99_ms']:.0f} ms, answered {f['answered_rps']:.1f} q/s, {f['pushed']} pushes, lowest "
                  f"concurrency limit {f['lowest_limit']}, mean degrade_ratio {f['mean_ratio']:.2f}", flush=True)
    load_after = os.getloadavg()
    command = "python -m bench.closed_loop " + " ".join(argv if argv is not None else sys.argv[1:])
    print(f"\nRun on {started:%Y-%m-%d %H:%M} UTC, `{command.strip()}`, {rounds} round(s), capacity "
          f"{capacity:.1f} q/s ({'measured, CPU model' if args.cpu else 'paced ' + PACE}), gateway SLO "
          f"{GATEWAY_SLO_MS:.0f} ms; load average {load_before[0]:.1f} before, {load_after[0]:.1f} after "
          f"({os.cpu_count()} CPUs)\n")
    print(table(results, oracles))
    if args.json:
        args.json.write_text(json.dumps({"capacity": capacity, "oracles": oracles, "sweep": swept, "runs": runs},
                                        indent=1))
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
