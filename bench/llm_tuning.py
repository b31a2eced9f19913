"""The continuous-batch tuner on the real stack: a streaming load step on the inference
server in LLM mode, with the tuner on (A) against the same load with the settings held
at the server's defaults (B: the same daemon and config in --dry-run, so max_num_seqs
256 and max_num_batched_tokens 2048 stay). Every round starts a fresh stack and daemon
per arm, the arms alternate with their order swapped each round, and both arms of a
round get the same requests (the same seeds). Everything is judged from the load
generator's own records: goodput (requests meeting both token SLOs per second), the
seconds whose TTFT P99 is over its SLO, TPOT P99, completed requests; and, for A, the
settings the tuner set over time (its audit log).

    python -m bench.llm_tuning                              # 3 rounds, about 14 minutes
    python -m bench.llm_tuning --rounds 1 --scale 0.5 --json /tmp/llm_tuning.json"""
from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from slotune.demo.run import LLM_SLOS_MS, OUTPUTS, PROMPTS, start_daemon, stop_daemon, this_runs_decisions
from slotune.demo.stack_config import LLM_INFERENCE_TUNERS, for_reference_stack
from reference_stack import launcher
from reference_stack.llm import load as llm_load

ARMS = {"A": "tuner on", "B": "defaults held (dry-run)"}
CALM_RPS = 1.0                 # the default model meets both SLOs here on this machine (docs/llm_serving.md)
STEP_FACTOR = 4.0              # the step: 4x calm, past what the CPU serves within the SLOs (3x was met at load avg 3.5)
TIMEOUT_S = 30.0               # a stream not done by then is a failed request (it is far past both SLOs anyway)


def plan(scale: float) -> list[tuple[str, float, float]]:
    return [("calm", CALM_RPS, 20 * scale), ("step", STEP_FACTOR * CALM_RPS, 40 * scale),
            ("calm again", CALM_RPS, 20 * scale)]


def run_arm(arm: str, round_no: int, scale: float, work: Path) -> dict:
    """One fresh stack and daemon, the load plan, and what the clients and the audit log say."""
    run_dir = work / f"round{round_no}-{arm}"
    run_dir.mkdir(parents=True)
    gateway, inference, sidecar, sidecar_admin, redis_port, exporter, *tools = launcher.free_ports(9)
    stack_cfg = launcher.StackConfig(
        run_dir=run_dir / "stack", gateway_port=gateway, inference_port=inference, sidecar_port=sidecar,
        sidecar_admin_port=sidecar_admin, redis_port=redis_port,
        tool_ports=dict(zip(launcher.StackConfig().tool_ports, tools)), inference_args=["--mode", "llm"])
    state = launcher.start(stack_cfg)
    daemon = None
    try:
        config = run_dir / "slotune.toml"
        # the gateway's tuners off: the load goes straight to the inference server, only its tuner is compared
        config.write_text(for_reference_stack(state, exporter, run_dir, gateway_slo_ms=600.0, gateway_tuners="",
                                              inference_slo_ms=30000.0, inference_tuners=LLM_INFERENCE_TUNERS,
                                              token_slos_ms=LLM_SLOS_MS))
        started = time.time()
        daemon = start_daemon(config, run_dir, f"http://127.0.0.1:{exporter}", dry_run=arm == "B")
        url = state["urls"]["inference"] + "/v1/completions"
        phases = []
        for i, (label, rate, seconds) in enumerate(plan(scale)):
            t0 = time.time()
            records = llm_load.run_llm_load(url, rate, seconds, PROMPTS, OUTPUTS, timeout_s=TIMEOUT_S,
                                            seed=1000 * round_no + i)
            phases.append((label, rate, seconds, t0 - started, records))
        decisions = this_runs_decisions(run_dir / "audit.jsonl", started)
    finally:
        stop_daemon(daemon)
        launcher.stop(stack_cfg.run_dir)
    result = judge(arm, round_no, phases, decisions, started)
    # a daemon step that raised decided nothing that second: an arm with many is not the tuner's
    result["daemon_errors"] = (run_dir / "daemon.log").read_text(errors="replace").count("Traceback")
    return result


def ttft_seconds_over(phases, slo_s: float) -> int:
    """Seconds (by scheduled arrival, 1-s windows over the whole run) whose requests' TTFT P99 is over
    the SLO; a request that got no first token (refused, timed out) counts as over."""
    windows: dict[int, list[float]] = {}
    for _, _, _, offset, records in phases:
        for r in records:
            ttft = r.ttft_s if r.status == 200 and not math.isnan(r.ttft_s) else math.inf
            windows.setdefault(int(offset + r.t_s), []).append(ttft)
    return sum(float(np.quantile(v, 0.99)) > slo_s if all(map(math.isfinite, v)) else True
               for v in windows.values())


def judge(arm: str, round_no: int, phases, decisions, started: float) -> dict:
    """The arm's figures; times of the settings in seconds from the daemon's start (the load starts with it)."""
    ttft_s, tpot_s = (ms / 1e3 for ms in LLM_SLOS_MS)
    records = [r for *_, rs in phases for r in rs]
    seconds = sum(p[2] for p in phases)
    whole = llm_load.summarize_llm(records, seconds, ttft_s, tpot_s)
    per_phase = {label: llm_load.summarize_llm(rs, s, ttft_s, tpot_s) for label, _, s, _, rs in phases}
    settings = [(round(d["t"] - started, 1), d["setting"], d["new"], d["outcome"])
                for d in decisions if d["tuner"] == "continuous_batch" and d["outcome"] in
                ("pushed", "rolled back", "dry-run")]
    return {"arm": arm, "round": round_no, "offered": len(records), "completed": sum(r.ok for r in records),
            "goodput_rps": whole["goodput_rps"], "step_goodput_rps": per_phase["step"]["goodput_rps"],
            "ttft_seconds_over": ttft_seconds_over(phases, ttft_s), "ttft_p99_s": whole["ttft_p99_s"],
            "tpot_p99_s": whole["tpot_p99_s"], "step_ttft_p99_s": per_phase["step"]["ttft_p99_s"],
            "step_tpot_p99_s": per_phase["step"]["tpot_p99_s"], "seconds": seconds, "settings": settings,
            "phases": {label: {k: p[k] for k in ("offered_rps", "completed_rps", "goodput_rps", "ttft_p99_s",
                                                 "tpot_p99_s")} for label, p in per_phase.items()},
            "decisions": [(round(d["t"] - started, 1), d["setting"], d["old"], d["new"], d["outcome"], d["reason"])
                          for d in decisions if d["tuner"] == "continuous_batch"]}


FIGURES = (("goodput_rps", "goodput (req/s, both SLOs)", 1, "{:.2f}"),
           ("step_goodput_rps", "goodput in the step (req/s)", 1, "{:.2f}"),
           ("ttft_seconds_over", "seconds with TTFT P99 > SLO", 1, "{:.0f}"),
           ("completed", "completed requests", 1, "{:.0f}"),
           ("ttft_p99_s", "TTFT P99 (s)", 1, "{:.1f}"),
           ("tpot_p99_s", "TPOT P99 (ms)", 1e3, "{:.0f}"))


def counted(r: dict) -> bool:
    """An arm counts unless it is A with daemon steps that raised: those decided nothing (B pushes nothing anyway)."""
    return r["arm"] == "B" or not r["daemon_errors"]


def table(results: list[dict]) -> str:
    """Medians with their range (min-max over the rounds counted), one column per arm."""
    lines = ["| figure | " + " | ".join(f"{a}: {ARMS[a]} ({sum(r['arm'] == a and counted(r) for r in results)} rounds)"
                                     for a in ARMS) + " |", "|---|---|---|"]
    for key, label, scale, fmt in FIGURES:
        cells = []
        for arm in ARMS:
            xs = [r[key] * scale for r in results if r["arm"] == arm and counted(r)]
            cells.append(f"{fmt.format(float(np.median(xs)))} ({fmt.format(min(xs))}-{fmt.format(max(xs))})"
                         if xs else "-")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def settings_line(result: dict) -> str:
    pushed = [(t, s, v) for t, s, v, outcome in result["settings"] if outcome == "pushed"]
    return ", ".join(f"{t:.0f} s {s.removeprefix('max_num_')}={v:.0f}" for t, s, v in pushed) or "none pushed"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="rounds; each runs both arms, order swapped each round")
    ap.add_argument("--scale", type=float, default=1.0, help="stretch the 20 s / 40 s / 20 s load plan")
    ap.add_argument("--json", type=Path, help="write every arm's figures and decisions here")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.scale <= 0:
        ap.error(f"--rounds {args.rounds} must be >= 1 and --scale {args.scale} > 0")
    work = Path(tempfile.mkdtemp(prefix="slotune-llm-tuning-"))
    steps = ", then ".join(f"{r:.0f} req/s for {s:.0f} s" for _, r, s in plan(args.scale))
    print(f"load: {steps}; SLOs TTFT P99 {LLM_SLOS_MS[0]:.0f} ms, TPOT P99 {LLM_SLOS_MS[1]:.0f} ms; work {work}",
          flush=True)
    results = []
    for round_no in range(args.rounds):
        for arm in ("AB" if round_no % 2 == 0 else "BA"):
            r = run_arm(arm, round_no, args.scale, work)
            results.append(r)
            print(f"round {round_no} {arm} ({ARMS[arm]}, load avg {os.getloadavg()[0]:.1f}): goodput "
                  f"{r['goodput_rps']:.2f} req/s (step {r['step_goodput_rps']:.2f}), {r['ttft_seconds_over']} s "
                  f"TTFT P99 over, {r['completed']}/{r['offered']} completed, TPOT P99 {r['tpot_p99_s'] * 1e3:.0f} ms"
                  + (f"; settings: {settings_line(r)}" if arm == "A" else "")
                  + (f"; {r['daemon_errors']} daemon steps raised (see {work})" if r["daemon_errors"] else ""), flush=True)
            if args.json:
                args.json.write_text(json.dumps(results, indent=1))
    print("\n" + table(results))
    if not all(map(counted, results)):
        print("not counted (daemon steps raised, nothing decided): " +
              ", ".join(f"round {r['round']} {r['arm']}" for r in results if not counted(r)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
