"""The closed loop on parts nobody here wrote: a real HAProxy in front of a real
vLLM (CPU build, tiny model, serve.SMALL_ENGINE: 4 sequences at once), through a
load step made from vLLM's capacity C measured on this host at the start of each
round: 0.5 C for 10 s, 2 C for 20 s, 0.5 C for 10 s. Arms, alternated in each round,
each on a fresh HAProxy (the engine stays up):

  none      no admission control (HAProxy's server maxconn 1000), no daemon
  static-N  HAProxy's server maxconn N, no daemon; the best of them is the oracle
  aimd      the daemon, throttle policy "aimd": the whitepaper's x0.9 / x1.1 rule on maxconn
  slotune   the daemon, throttle policy "slotune"

Both daemon arms observe vLLM and push HAProxy's maxconn (`admission_by`), starting
from 48, and steer on TTFT (the service declares a TTFT objective). A request HAProxy
cannot hand on within 50 ms gets its 503 at once.

Per arm, from the load generator's own clock: seconds whose TTFT P99 (of answers that
began in that second) is over the objective, goodput (answers meeting the TTFT and
TPOT objectives per second), refused share (503), client TTFT P50/P99. Medians over
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

from slotune.demo.run import start_daemon, stop_daemon  # noqa: E402
from reference_stack.engine import proxy, serve  # noqa: E402
from reference_stack.launcher import free_ports  # noqa: E402
from reference_stack.llm.load import Lengths, run_llm_load  # noqa: E402

TTFT_SLO_MS, TPOT_SLO_MS, QUEUE_TIMEOUT_MS, START = 500, 50, 50, 48
PROMPT, ANSWER = Lengths(900, 0, 900, "fixed"), Lengths(32, 0, 32, "fixed")
STREAM = {"ignore_eos": True, "stream_options": {"include_usage": True}}   # every answer its max_tokens long
STEP = ((0.5, 10.0), (2.0, 20.0), (0.5, 10.0))     # (x capacity, seconds)


def admission_config(engine_port: int, hp: proxy.Haproxy, exporter_port: int, work: Path, policy: str) -> str:
    """The daemon's config: vLLM observed, its TTFT objective, throttled at HAProxy (admission_by)."""
    return f"""[daemon]
collect_interval_s = 1.0
exporter_address = "127.0.0.1:{exporter_port}"
baseline_store = "{work}/baselines.sqlite"
audit_log = "{work}/audit.jsonl"
state_file = "{work}/state.json"
environment = "test"
probes = ["http"]

[services.vllm]
port = {engine_port}
profile = "vllm"
metrics_url = "http://127.0.0.1:{engine_port}/metrics"
slo_p99_ms = 5000
slo_ttft_p99_ms = {TTFT_SLO_MS}
admission_by = "front"
[services.vllm.tuners.throttle]
policy = "{policy}"
interval_s = 1
[services.vllm.settings.concurrency_limit]
min = 1
max = {START}
max_step = {START // 2}
integer = true

[services.front]
port = {hp.port}
profile = "haproxy"
metrics_url = "{hp.metrics_url}"
[services.front.control]
kind = "haproxy"
address = "{hp.socket}"
[services.front.control.targets]
concurrency_limit = "{hp.target}"
"""


def measure_capacity(url: str) -> float:
    """Completions per second under an overload (60 req/s for 6 s) at a wide limit."""
    records = run_llm_load(url, 60.0, 6.0, PROMPT, ANSWER, model=serve.SERVED_NAME, extra=STREAM, seed=8)
    ends = sorted(r.t_s + r.start_delay_s + r.e2e_s for r in records if r.ok)
    return (len(ends) - 1) / (ends[-1] - ends[0])


def drive(url: str, capacity: float, seed: int) -> list[tuple[float, object]]:
    """The step, phase after phase: (seconds from its start, record) of each request."""
    out, t0 = [], time.monotonic()
    for i, (x, seconds) in enumerate(STEP):
        began = time.monotonic() - t0
        out += [(began + r.t_s, r) for r in run_llm_load(url, x * capacity, seconds, PROMPT, ANSWER,
                                                         model=serve.SERVED_NAME, extra=STREAM, seed=seed + i)]
    return out


def score(records, seconds: float) -> dict:
    served = [(t, r) for t, r in records if r.status == 200 and not r.error]
    ttft = np.array([r.ttft_s for _, r in served])
    over = 0
    for s in range(int(seconds)):
        began = [r.ttft_s for t, r in served if s <= t < s + 1]
        over += bool(began) and float(np.quantile(began, 0.99)) > TTFT_SLO_MS / 1e3
    good = [r for _, r in served if r.ttft_s <= TTFT_SLO_MS / 1e3 and (r.output_tokens < 2 or r.tpot_s <= TPOT_SLO_MS / 1e3)]
    return {"over_s": over, "goodput_rps": len(good) / seconds,
            "refused": sum(r.status == 503 for _, r in records) / max(len(records), 1),
            "ttft_p50_ms": float(np.median(ttft)) * 1e3 if len(ttft) else float("nan"),
            "ttft_p99_ms": float(np.quantile(ttft, 0.99)) * 1e3 if len(ttft) else float("nan")}


def run_arm(arm: str, engine_port: int, capacity: float, work: Path, seed: int) -> dict:
    maxconn = 1000 if arm == "none" else int(arm.split("-")[1]) if arm.startswith("static-") else START
    with proxy.haproxy(work / "haproxy", engine_port, maxconn, queue_timeout_ms=QUEUE_TIMEOUT_MS) as hp:
        daemon = None
        if arm in ("aimd", "slotune"):
            port, = free_ports(1)
            (work / "slotune.toml").write_text(admission_config(engine_port, hp, port, work, arm))
            daemon = start_daemon(work / "slotune.toml", work, f"http://127.0.0.1:{port}", False)
        try:
            records = drive(f"http://127.0.0.1:{hp.port}/v1/completions", capacity, seed)
        finally:
            stop_daemon(daemon)
    return score(records, sum(s for _, s in STEP))


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
        with serve.vllm(Path(tmp) / "vllm", port, *serve.SMALL_ENGINE):
            for n in range(args.rounds):
                with proxy.haproxy(Path(tmp) / f"probe{n}", port, 1000, queue_timeout_ms=60_000) as hp:
                    capacity = measure_capacity(f"http://127.0.0.1:{hp.port}/v1/completions")
                order = arms if n % 2 == 0 else arms[::-1]
                got = {}
                for i, arm in enumerate(order):
                    print(f"round {n + 1}/{args.rounds}, C {capacity:.1f} req/s: {arm} ({i + 1}/{len(arms)})", flush=True)
                    got[arm] = run_arm(arm, port, capacity, Path(tmp) / f"r{n}-{arm}", seed=100 * n)
                rounds.append({"capacity_rps": capacity, "arms": got})
    print(table(rounds, arms, started, args))
    if args.json:
        Path(args.json).write_text(json.dumps(rounds, indent=1))
    return 0


def table(rounds: list[dict], arms: list[str], started, args) -> str:
    def med(arm, key, fmt):
        xs = [r["arms"][arm][key] for r in rounds]
        return f"{fmt(np.median(xs))} [{fmt(min(xs))}-{fmt(max(xs))}]"

    statics = [a for a in arms if a.startswith("static-")]
    oracle = max(statics, key=lambda a: np.median([r["arms"][a]["goodput_rps"] for r in rounds]))
    cols = ("over_s", "goodput_rps", "refused", "ttft_p50_ms", "ttft_p99_ms")
    fmts = {"over_s": lambda x: f"{x:.0f}", "goodput_rps": lambda x: f"{x:.1f}", "refused": lambda x: f"{x:.2f}",
            "ttft_p50_ms": lambda x: f"{x:.0f}", "ttft_p99_ms": lambda x: f"{x:.0f}"}
    rows = [("arm", "s over TTFT SLO", "goodput (req/s)", "refused", "TTFT P50 (ms)", "TTFT P99 (ms)")]
    rows += [(a + (" (oracle)" if a == oracle else ""), *(med(a, c, fmts[c]) for c in cols)) for a in arms]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    caps = ", ".join(f"{r['capacity_rps']:.1f}" for r in rounds)
    head = (f"engine loop, {started:%Y-%m-%d %H:%M} UTC, {len(rounds)} round(s), C = {caps} req/s; "
            f"TTFT SLO {TTFT_SLO_MS} ms, TPOT SLO {TPOT_SLO_MS} ms; step 0.5 C / 2 C / 0.5 C, 10 / 20 / 10 s")
    return head + "\n" + "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in
                                             enumerate(zip(r, widths))) for r in rows)


if __name__ == "__main__":
    sys.exit(main())
