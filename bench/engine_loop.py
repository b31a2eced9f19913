"""The closed loop on parts nobody here wrote: a real HAProxy in front of a real
vLLM (CPU build, tiny model, serve.SMALL_ENGINE: 4 sequences at once), through a
load step made from vLLM's capacity C measured on this host just before each arm
(it drifts from minute to minute here: 16 to 37 requests/s in one run): 0.5 C for
10 s, 2 C for 20 s, 0.5 C for 10 s. vLLM runs on a CPU of its own,
HAProxy, the daemon and the client on the rest (serve.beside_the_engine()). Arms,
alternated in each round, each on a fresh HAProxy (the engine stays up):

  none      no admission control (HAProxy's server maxconn 1000), no daemon
  static-N  HAProxy's server maxconn N, no daemon; the best of them is the oracle
  aimd      the daemon, throttle policy "aimd": the whitepaper's x0.9 / x1.1 rule on maxconn
  slotune   the daemon, throttle policy "slotune"

Both daemon arms observe vLLM and push HAProxy's maxconn (`admission_by`), starting
from 64, and steer on TTFT (the service declares a TTFT objective). A request HAProxy
cannot hand on within 50 ms gets its 503 at once. The set-up, the real-time client
and the scoring are reference_stack/engine/loop.py's, shared with the loop test and
`slotune demo --engine vllm`.

Per arm, from the load generator's own clock: seconds whose TTFT P99 (of answers that
began in that second) is over the objective, goodput (answers meeting the TTFT and
TPOT objectives per second, and over the arm's C, which compares arms whose C
differed), refused share (503), client TTFT P50/P99. Medians over
the rounds with [min-max].

    python -m bench.engine_loop                     # 3 rounds
    python -m bench.engine_loop --rounds 1 --static 4,8 --json /tmp/engine_loop.json

Needs root (the daemon's eBPF probes) and `make engine`."""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from slotune.demo.run import start_daemon, stop_daemon, this_runs_decisions  # noqa: E402
from reference_stack.engine import proxy, serve  # noqa: E402
from reference_stack.engine.loop import (QUEUE_TIMEOUT_MS, START, TPOT_SLO_MS, TTFT_SLO_MS,  # noqa: E402
                                         admission_config, drive, measure_capacity, score)
from reference_stack.launcher import free_ports  # noqa: E402

STEP = ((0.5, 10.0), (2.0, 20.0), (0.5, 10.0))     # (x capacity, seconds)


def run_arm(arm: str, engine_port: int, work: Path, seed: int) -> dict:
    """The arm's step, made from vLLM's capacity measured just before it."""
    capacity = measure_capacity(engine_port, work / "capacity")
    print(f"  C {capacity:.1f} req/s", flush=True)
    maxconn = 1000 if arm == "none" else int(arm.split("-")[1]) if arm.startswith("static-") else START
    with proxy.haproxy(work / "haproxy", engine_port, maxconn, queue_timeout_ms=QUEUE_TIMEOUT_MS) as hp:
        daemon = None
        if arm in ("aimd", "slotune"):
            port, = free_ports(1)
            (work / "slotune.toml").write_text(admission_config(engine_port, hp, port, work, arm))
            daemon = start_daemon(work / "slotune.toml", work, f"http://127.0.0.1:{port}", False)
        began = time.time()
        try:
            records = drive(f"http://127.0.0.1:{hp.port}/v1/completions", capacity, STEP, seed)
        finally:
            stop_daemon(daemon)
    moves = [(round(d["t"] - began, 1), d["old"], d["new"], d["outcome"])
             for d in this_runs_decisions(work / "audit.jsonl", began) if d["outcome"] != "kept"] if daemon else []
    got = score(records, sum(s for _, s in STEP))
    return {**got, "capacity_rps": capacity, "goodput_per_c": got["goodput_rps"] / capacity, "moves": moves}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.engine_loop", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--static", default="4,8,16", help="the static maxconn values swept (the oracle is the best)")
    ap.add_argument("--json", help="write the per-round figures there")
    args = ap.parse_args(argv)
    if why := serve.missing():
        print(why, file=sys.stderr)
        return 2
    arms = ["none", *(f"static-{n}" for n in args.static.split(",")), "aimd", "slotune"]
    rounds: list[dict] = []
    started = datetime.now(timezone.utc)
    with tempfile.TemporaryDirectory(prefix="engine-loop-") as tmp:
        port, = free_ports(1)
        with serve.vllm(Path(tmp) / "vllm", port, *serve.SMALL_ENGINE, own_cpu=True), serve.beside_the_engine():
            print("warming the engine up (a capacity measure, not kept)", flush=True)
            measure_capacity(port, Path(tmp) / "warm-up")      # a cold engine's first read 21 req/s, later ones 25-33
            for n in range(args.rounds):
                order = arms if n % 2 == 0 else arms[::-1]
                got = {}
                for i, arm in enumerate(order):
                    print(f"round {n + 1}/{args.rounds}: {arm} ({i + 1}/{len(arms)})", flush=True)
                    got[arm] = run_arm(arm, port, Path(tmp) / f"r{n}-{arm}", seed=100 * n)
                rounds.append({"arms": got})
    print(table(rounds, arms, started, args))
    if args.json:
        Path(args.json).write_text(json.dumps(rounds, indent=1))
    return 0


def table(rounds: list[dict], arms: list[str], started, args) -> str:
    def med(arm, key, fmt):
        xs = [r["arms"][arm][key] for r in rounds]
        return f"{fmt(np.median(xs))} [{fmt(min(xs))}-{fmt(max(xs))}]"

    statics = [a for a in arms if a.startswith("static-")]
    oracle = max(statics, key=lambda a: np.median([r["arms"][a]["goodput_per_c"] for r in rounds]))
    cols = ("over_s", "goodput_per_c", "goodput_rps", "refused", "ttft_p50_ms", "ttft_p99_ms")
    fmts = {"over_s": lambda x: f"{x:.0f}", "goodput_per_c": lambda x: f"{x:.2f}", "goodput_rps": lambda x: f"{x:.1f}",
            "refused": lambda x: f"{x:.2f}", "ttft_p50_ms": lambda x: f"{x:.0f}", "ttft_p99_ms": lambda x: f"{x:.0f}"}
    rows = [("arm", "s over TTFT SLO", "goodput ÷ C", "goodput (req/s)", "refused", "TTFT P50 (ms)",
             "TTFT P99 (ms)")]
    rows += [(a + (" (oracle)" if a == oracle else ""), *(med(a, c, fmts[c]) for c in cols)) for a in arms]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    caps = [a["capacity_rps"] for r in rounds for a in r["arms"].values()]
    head = (f"engine loop, {started:%Y-%m-%d %H:%M} UTC, {len(rounds)} round(s), C per arm {np.median(caps):.1f} "
            f"[{min(caps):.1f}-{max(caps):.1f}] req/s; "
            f"TTFT SLO {TTFT_SLO_MS} ms, TPOT SLO {TPOT_SLO_MS} ms; step 0.5 C / 2 C / 0.5 C, 10 / 20 / 10 s")
    return head + "\n" + "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in
                                             enumerate(zip(r, widths))) for r in rows)


if __name__ == "__main__":
    sys.exit(main())
