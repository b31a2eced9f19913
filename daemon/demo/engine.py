"""`slotune demo --engine vllm`: the closed loop on parts nobody here wrote. A real
vLLM (its CPU build and the tiny model from `make engine`) behind a real HAProxy;
slotune observes vLLM and throttles HAProxy's server maxconn to hold the TTFT
objective through a step to twice vLLM's measured capacity and back
(reference_stack/engine/loop.py, the same set-up as the engine bench). Shows the
live status while it runs and writes an HTML report: the client's TTFT per phase,
HAProxy's maxconn as `show stat` read it each second, and every decision."""
from __future__ import annotations

import threading
import time
from pathlib import Path

from slotune.demo import report
from slotune.demo.run import fetch_status, start_daemon, stop_daemon, this_runs_decisions
from slotune.export.status_table import render
from reference_stack.engine import loop, proxy, serve
from reference_stack.launcher import free_ports

STEP = ((0.5, 20.0), (2.0, 40.0), (0.5, 30.0))     # (x capacity, seconds)


def run(run_dir: Path, scale: float, dry_run: bool, show_every_s: float = 10.0) -> Path:
    if why := serve.missing():
        raise RuntimeError(why)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "state.json").unlink(missing_ok=True)
    engine_port, exporter = free_ports(2)
    step = [(x, seconds * scale) for x, seconds in STEP]
    print(f"==> starting vLLM (tiny model) in {run_dir / 'vllm'}: about 30 s", flush=True)
    with serve.vllm(run_dir / "vllm", engine_port, *serve.SMALL_ENGINE, own_cpu=True), serve.beside_the_engine():
        print("==> measuring vLLM's capacity (60 requests/s for 6 s, through HAProxy)", flush=True)
        capacity = loop.measure_capacity(engine_port, run_dir / "capacity")
        print(f"    C = {capacity:.1f} requests/s", flush=True)
        with proxy.haproxy(run_dir / "haproxy", engine_port, loop.START, queue_timeout_ms=loop.QUEUE_TIMEOUT_MS) as hp:
            config = run_dir / "slotune.toml"
            config.write_text(loop.admission_config(engine_port, hp, exporter, run_dir, "slotune"))
            url = f"http://127.0.0.1:{exporter}"
            print(f"==> starting slotune ({'dry-run' if dry_run else 'closed loop'}), config {config}", flush=True)
            started = time.time()
            daemon = start_daemon(config, run_dir, url, dry_run)
            try:
                snaps, marks, maxconn, records = watch(hp, url, capacity, step, show_every_s)
            finally:
                stop_daemon(daemon)
    decisions = this_runs_decisions(run_dir / "audit.jsonl", started)
    summary = phase_lines(records, step, capacity) + [
        "HAProxy's server maxconn (show stat), every 5 s: " + " ".join(str(m) for m in maxconn[::5]),
        f"{sum(d['outcome'] == 'pushed' for d in decisions)} pushes of {len(decisions)} decisions"
        + (" (dry-run: nothing pushed)" if dry_run else ""),
        f"config {config}, audit log {run_dir / 'audit.jsonl'}, daemon log {run_dir / 'daemon.log'}, "
        f"vLLM log {run_dir / 'vllm' / 'vllm.log'}"]
    path = report.write(run_dir / "report.html", snaps, decisions, marks, summary)
    print("\n" + "\n".join(summary), flush=True)
    return path


def watch(hp: proxy.Haproxy, url: str, capacity: float, step, show_every_s: float):
    """Drive the step on a thread; meanwhile /status and HAProxy's maxconn each second."""
    marks: list[tuple[float, str]] = []
    records: list = []
    driving = threading.Thread(target=lambda: records.extend(
        loop.drive(f"http://127.0.0.1:{hp.port}/v1/completions", capacity, step, seed=0, marks=marks)), daemon=True)
    print("==> load: " + ", then ".join(f"{x * capacity:.0f} requests/s for {s:.0f} s" for x, s in step), flush=True)
    driving.start()
    snaps, maxconn, last_shown = [], [], 0.0
    while driving.is_alive():
        if (status := fetch_status(url)) is not None:
            status["t"] = time.time()
            snaps.append(status)
            if status["t"] - last_shown >= show_every_s:
                print(f"\n--- {time.strftime('%H:%M:%S')} load {marks[-1][1] if marks else ''}\n{render(status)}",
                      flush=True)
                last_shown = status["t"]
        maxconn.append(int(hp.stat()["slim"]))
        time.sleep(1.0)
    return snaps, marks, maxconn, records


def phase_lines(records, step, capacity: float) -> list[str]:
    """Per phase, from the client's clock: TTFT P99 against the objective, refused, goodput."""
    lines, begin = [], 0.0
    for x, seconds in step:
        s = loop.score([(t - begin, r) for t, r in records if begin <= t < begin + seconds], seconds)
        verdict = "under" if s["ttft_p99_ms"] <= loop.TTFT_SLO_MS else "OVER"
        lines.append(f"{x:g} C ({x * capacity:.0f} requests/s, {seconds:.0f} s): client TTFT P50 "
                     f"{s['ttft_p50_ms']:.0f} ms, P99 {s['ttft_p99_ms']:.0f} ms ({verdict} the {loop.TTFT_SLO_MS} ms "
                     f"objective), {s['over_s']} s over it, refused {s['refused']:.0%}, goodput "
                     f"{s['goodput_rps']:.1f} requests/s")
        begin += seconds
    return lines
