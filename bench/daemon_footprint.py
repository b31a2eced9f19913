"""The daemon's own cost: CPU and RSS of `slotune run` (all probe families
loaded) idle and while the reference stack serves load, side by side with the
stack's own CPU; the stack's closed-loop throughput and P99 with the daemon
attached and without, alternating rounds; and over a longer run, the daemon's
RSS (is it flat?) and its CPU once attribution's 300 s horizon is full (the
phases before see only the first minute of history). Beside RSS, the daemon's unique memory (USS: pages no other
process maps) and how many other processes mapped the BPF compiler meanwhile
(a bcc tool, another slotune): the libraries both map count in both RSSes.
Shortest useful run (~65 s): --idle-s 10 --load-s 20 --rounds 0.

    python -m bench.daemon_footprint [--idle-s 20] [--load-s 30] [--rate 15]
                                     [--rounds 4] [--round-s 10] [--long-s 0]"""
from __future__ import annotations

import argparse
import asyncio
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import psutil

from slotune.attribution.explain import HORIZON_S
from slotune.process import HISTORY_S
from slotune.demo.stack_config import DEMO_STACK_SETTINGS, for_reference_stack
from reference_stack import launcher, loadgen
from reference_stack.loadgen import closed_loop

ROOT = Path(__file__).resolve().parents[1]


def cpu_seconds(procs: list[psutil.Process]) -> float:
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.NoSuchProcess:
            pass
    return total


def unique_bytes(pid: int) -> int:
    """Memory only this process maps (USS), from /proc/<pid>/smaps_rollup."""
    with open(f"/proc/{pid}/smaps_rollup") as f:
        return sum(int(line.split()[1]) * 1024 for line in f if line.startswith(("Private_Clean:", "Private_Dirty:")))


def compiler_users(but: int) -> int:
    """Other processes that map the BPF compiler (libLLVM) now."""
    count = 0
    for p in psutil.process_iter():
        try:
            if p.pid != but and any("libLLVM" in m.path for m in p.memory_maps(grouped=True)):
                count += 1
        except (psutil.Error, OSError):
            pass
    return count


def measure(daemon: psutil.Process, stack: list[psutil.Process], seconds: float) -> dict:
    """CPU (percent of one core) of the daemon and of the stack over `seconds`, the daemon's
    largest RSS and USS, and the most other compiler users seen at once."""
    d0, s0, t0 = cpu_seconds([daemon]), cpu_seconds(stack), time.monotonic()
    rss, uss, others = [], [], 0
    while time.monotonic() - t0 < seconds:
        rss.append(daemon.memory_info().rss)
        uss.append(unique_bytes(daemon.pid))
        if len(rss) % 5 == 1:
            others = max(others, compiler_users(daemon.pid))
        time.sleep(1.0)
    dt = time.monotonic() - t0
    return {"daemon_cpu": 100 * (cpu_seconds([daemon]) - d0) / dt, "stack_cpu": 100 * (cpu_seconds(stack) - s0) / dt,
            "rss_mib": max(rss) / 2**20, "uss_mib": max(uss) / 2**20, "others": others}


def start_daemon(work: Path, port: int) -> subprocess.Popen:
    log = open(work / "daemon.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "slotune.cli", "run", "--config", str(work / "slotune.toml"),
                             "--dry-run"], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    wait_up(f"http://127.0.0.1:{port}", proc)
    return proc


def stop_daemon(proc: subprocess.Popen | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)


def throughput_rounds(state: dict, work: Path, port: int, rounds: int, seconds: float, clients: int) -> dict:
    """Closed-loop throughput and P99 of the stack, daemon off / on, alternating (order flips each round)."""
    out = {"off": [], "on": []}
    for r in range(rounds):
        for mode in (("off", "on") if r % 2 == 0 else ("on", "off")):
            proc = start_daemon(work, port) if mode == "on" else None
            try:
                time.sleep(2.0)
                lat = asyncio.run(closed_loop(state["query_url"], clients, seconds, seed=r))
            finally:
                stop_daemon(proc)
            out[mode].append((len(lat) / seconds, float(np.quantile(lat, 0.99)) if lat else float("nan")))
    return out


def wait_up(url: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 90
    while True:
        try:
            urllib.request.urlopen(url + "/status", timeout=2).close()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the daemon did not come up (exit {proc.poll()})") from None
            time.sleep(0.5)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--idle-s", type=float, default=20.0)
    ap.add_argument("--load-s", type=float, default=30.0)
    ap.add_argument("--rate", type=float, default=15.0, help="queries/s through the gateway during the load phase")
    ap.add_argument("--rounds", type=int, default=4, help="throughput rounds with the daemon off and on")
    ap.add_argument("--round-s", type=float, default=10.0)
    ap.add_argument("--clients", type=int, default=16, help="closed-loop clients in the throughput rounds")
    ap.add_argument("--long-s", type=float, default=0.0,
                    help="then the daemon's RSS, and its CPU once the attribution horizon is full, over this long "
                         "under load (420 = 7 min)")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="slotune-footprint-"))
    cfg = launcher.StackConfig.on_free_ports(work / "stack", settings=DEMO_STACK_SETTINGS)
    state = launcher.start(cfg)
    daemon = None
    try:
        port = launcher.free_ports(1)[0]
        (work / "slotune.toml").write_text(for_reference_stack(state, port, work))
        daemon = start_daemon(work, port)
        dproc = psutil.Process(daemon.pid)
        stack = [psutil.Process(pid) for name, pid in state["pids"].items() if name != "redis"]
        time.sleep(5.0)  # past start-up (BPF compile, first scans)
        idle = measure(dproc, stack, args.idle_s)
        loader = threading.Thread(target=loadgen.run_load, args=(state["query_url"], args.rate, args.load_s + 2))
        loader.start()
        time.sleep(1.0)
        busy = measure(dproc, stack, args.load_s)
        loader.join()
        print(f"slotune daemon footprint, {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, "
              f"all probe families, 1 s windows, dry-run; {psutil.cpu_count()} CPUs")
        print(f"{'phase':<22} {'daemon CPU %':>13} {'stack CPU %':>12} {'daemon/stack':>13} {'daemon RSS MiB':>15} "
              f"{'USS MiB':>8} {'other BCC':>10}")
        for name, m in ((f"idle ({args.idle_s:.0f} s)", idle), (f"load {args.rate:.0f} q/s ({args.load_s:.0f} s)", busy)):
            ratio = m["daemon_cpu"] / m["stack_cpu"] if m["stack_cpu"] > 0 else float("nan")
            print(f"{name:<22} {m['daemon_cpu']:>13.1f} {m['stack_cpu']:>12.1f} {ratio:>13.3f} {m['rss_mib']:>15.1f} "
                  f"{m['uss_mib']:>8.1f} {m['others']:>10d}")
        if daemon.poll() is not None:
            raise SystemExit(f"the daemon exited during the run; see {work / 'daemon.log'}")
        if args.rounds:
            stop_daemon(daemon)
            rounds = throughput_rounds(state, work, port, args.rounds, args.round_s, args.clients)
            med = {m: (float(np.median([r[0] for r in v])), float(np.median([r[1] for r in v])))
                   for m, v in rounds.items()}
            spread = {m: (min(r[0] for r in v), max(r[0] for r in v)) for m, v in rounds.items()}
            print(f"\nstack throughput, {args.clients} closed-loop clients, {args.rounds} rounds x {args.round_s:.0f} s "
                  f"alternating (medians, min..max):")
            for m in ("off", "on"):
                print(f"  daemon {m:<3}  {med[m][0]:6.1f} q/s ({spread[m][0]:.1f}..{spread[m][1]:.1f})  "
                      f"P99 {med[m][1] * 1e3:6.0f} ms")
            print(f"  with the daemon: throughput x{med['on'][0] / med['off'][0]:.3f}, "
                  f"P99 x{med['on'][1] / med['off'][1]:.3f}")
            daemon = start_daemon(work, port)
            dproc = psutil.Process(daemon.pid)
        if args.long_s > 0:
            samples = []    # (seconds in, daemon RSS MiB, daemon CPU s, stack CPU s), every 10 s
            loader = threading.Thread(target=loadgen.run_load, args=(state["query_url"], args.rate, args.long_s))
            loader.start()
            t0 = time.monotonic()
            while time.monotonic() - t0 < args.long_s:
                samples.append((time.monotonic() - t0, dproc.memory_info().rss / 2**20,
                                cpu_seconds([dproc]), cpu_seconds(stack)))
                time.sleep(10.0)
            loader.join()
            print(f"RSS over {args.long_s:.0f} s at {args.rate:.0f} q/s, every 60 s (MiB): "
                  + " ".join(f"{s[1]:.0f}" for s in samples[::6]))
            full = [s for s in samples if s[0] >= HISTORY_S]   # once the daemon's window history is full
            if len(full) > 1:
                print(f"after the {HISTORY_S:.0f} s window history filled: {full[0][1]:.1f} -> {full[-1][1]:.1f} MiB "
                      f"({full[-1][1] - full[0][1]:+.1f} MiB over {full[-1][0] - full[0][0]:.0f} s)")
            steady = [s for s in samples if s[0] >= HORIZON_S]   # attribution reads its whole horizon
            if len(steady) > 1:
                dt = steady[-1][0] - steady[0][0]
                print(f"CPU once attribution's {HORIZON_S:.0f} s horizon was full ({dt:.0f} s): daemon "
                      f"{100 * (steady[-1][2] - steady[0][2]) / dt:.2f} %, stack "
                      f"{100 * (steady[-1][3] - steady[0][3]) / dt:.1f} %")
    finally:
        stop_daemon(daemon)
        launcher.stop(cfg.run_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
