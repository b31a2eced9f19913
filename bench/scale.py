"""Scale: how the daemon's cost grows with the number of services it watches and
the connections open on the host. For each point of a sweep, services S x idle
connections C, a fresh `slotune run` (kernel probes on, under the shipped unit's
capabilities and file-system view, bench/unit_sandbox.py) watches and tunes S
real loopback services, each its own process (bench/chaos_services.py Healthy:
/metrics and a JSON /admin/config; one process each because the kernel side
counts a task for one service only), each with a throttle every 2 s and a light
open-loop GET load (--rate requests/s each, Poisson, from one asyncio client
process), beside one more watched service, `flood`, found by its port but
without a /metrics to read, whose processes hold C idle loopback connections
(chaos_services.flood). After a warm-up it measures, over the window:

  - the daemon's CPU, percent of one core (utime + stime of /proc/<pid>/stat),
    over the window while the bench scrapes its /metrics each second, and over
    --quiet seconds after it without a scrape (`quiet`: its cost to a
    Prometheus that scrapes every 15 s is close to this);
  - its RSS at the end of the window (MiB);
  - its ticks, slotune_tick_duration_seconds read from its /metrics each second:
    median and P99;
  - its /metrics: series exported, body size, how long one scrape takes (median);
  - the BPF map counters it exports (slotune_bpf_map_full_total and
    slotune_bpf_map_evicted_total, summed over maps; the maps that lost entries
    are named);
  - how long it took to say READY=1, the services it found processes for, the
    tuner intervals without a decision (audit log), whether it ran throughout.

Its RSS is the RSS about a minute after start: the window history (HISTORY_S,
10 min) is still filling, so the per-service RSS figure is a lower bound of the
steady one. At the end, a least-squares fit cost = a + b*S + c*(C/10 000) over
the points for both CPUs, RSS and tick P99, with the slope between consecutive
S, to show a cost that grows faster than linearly. Exit 1 if the daemon died or
never said READY=1; 2 without root (the daemon loads BPF).

    sudo .venv/bin/python -m bench.scale                     # S 1, 10, 50 x C 0, 20 000 (~7 min)
    sudo .venv/bin/python -m bench.scale --services 1 10 50 200         # and 200 services (~11 min)
    sudo .venv/bin/python -m bench.scale --services 1 3 --conns 0 500 --warmup 5 --seconds 10   # a quick look (~2 min)"""
from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from bench.chaos import WATCHDOG_S, Watchdog, config_text, decisions, missed
from bench.chaos_services import flood
from bench.daemon_footprint import stop_daemon
from bench.soak import sample
from bench.unit_sandbox import sandboxed
from reference_stack import launcher

ROOT = Path(__file__).resolve().parents[1]
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
READY_S = 180.0           # longest wait for the daemon's READY=1
MAP_PREFIX = "slotune_bpf_map_"


@dataclass
class Point:
    services: int
    conns: int
    ready_s: float = float("nan")
    cpu_pct: float = float("nan")         # percent of one core, scraped each second
    quiet_pct: float = float("nan")       # percent of one core, not scraped
    rss_mib: float = float("nan")
    ticks: list[float] = field(default_factory=list)
    late: list[float] = field(default_factory=list)        # slotune_ticks_late_total at each scrape
    late_quiet: float = float("nan")                       # ticks late over the unscraped seconds
    scrape_s: list[float] = field(default_factory=list)
    scrape_failures: int = 0
    series: int = 0
    body_bytes: int = 0
    maps: dict[str, float] = field(default_factory=dict)   # 'metric{map="x"}' -> value, the nonzero ones
    found: int = 0                                         # services with processes found (of S + 1)
    missed: int = 0                                        # tuner intervals without a decision, all services
    load: str = ""
    died: str = ""                                         # why, when the daemon did not run throughout

    def tick_ms(self, q: float) -> float:
        return float(np.quantile(self.ticks, q)) * 1e3 if self.ticks else float("nan")

    def map_total(self, metric: str) -> float:
        return sum(v for k, v in self.maps.items() if k.startswith(metric))


# ---- the load: one process, an open-loop Poisson stream of GETs to each port ----

async def _get(port: int, counts: dict[str, int]) -> None:
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5)
        writer.write(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        counts["ok" if answer.startswith(b"HTTP/1.1 200") else "failed"] += 1
    except (OSError, asyncio.TimeoutError):
        counts["failed"] += 1


async def _load(rate: float, ports: list[int]) -> None:
    counts, tasks, stop = {"ok": 0, "failed": 0}, set(), asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)

    async def stream(port: int, rng: random.Random) -> None:
        while True:
            await asyncio.sleep(rng.expovariate(rate))
            task = asyncio.create_task(_get(port, counts))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    streams = [asyncio.create_task(stream(p, random.Random(p))) for p in ports]
    print("loading", flush=True)
    began = time.monotonic()
    await stop.wait()
    for s in streams:
        s.cancel()
    took = time.monotonic() - began
    print(f"{counts['ok'] / took / max(len(ports), 1):.1f} req/s a service answered, {counts['failed']} failed",
          flush=True)


def start_load(rate: float, ports: list[int]) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "bench.scale", "load", str(rate), *map(str, ports)],
                            cwd=ROOT, stdout=subprocess.PIPE, text=True)
    proc.stdout.readline()      # "loading"
    return proc


def stop_load(proc: subprocess.Popen) -> str:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.communicate(timeout=15)[0].strip()
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return "the load did not stop"


# ---- the services and the idle connections ----

def start_services(ports: list[int]) -> list[subprocess.Popen]:
    """One Healthy per process, all started at once; returned once each says ready."""
    procs = [subprocess.Popen([sys.executable, "-m", "bench.chaos_services", "healthy", str(p)], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) for p in ports]
    for p in procs:
        p.stdout.readline()
    return procs


def hold_idle(port: int, n: int) -> list[subprocess.Popen]:
    """flood(port, n); for n = 0 one holder of none, so that the flood service has a process at every point."""
    if n:
        return flood(port, n)
    proc = subprocess.Popen([sys.executable, "-m", "bench.chaos_services", "hold", str(port), "0", "0"],
                            cwd=ROOT, stdout=subprocess.PIPE)
    proc.stdout.readline()
    return [proc]


def kill_all(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        p.wait()


# ---- the daemon ----

def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, all its threads, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def scrape(url: str, point: Point) -> bytes:
    """One GET of the daemon's /metrics: its time, size, series, tick, BPF map counters and the
    services it found processes for, into point; the body."""
    began = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            body = resp.read()
    except OSError:
        point.scrape_failures += 1
        return b""
    point.scrape_s.append(time.monotonic() - began)
    lines = [line for line in body.decode(errors="replace").splitlines() if line and not line.startswith("#")]
    point.series, point.body_bytes = len(lines), len(body)
    point.ticks += [float(line.split()[1]) for line in lines if line.startswith("slotune_tick_duration_seconds ")]
    point.late += [float(line.split()[1]) for line in lines if line.startswith("slotune_ticks_late_total ")]
    point.maps = {name: float(value) for name, value in (line.rsplit(" ", 1) for line in lines
                                                         if line.startswith(MAP_PREFIX)) if float(value)}
    point.found = sum(1 for line in lines if line.startswith("slotune_service_processes{") and float(line.split()[-1]))
    return body


def start_daemon(work: Path, config: Path) -> tuple[subprocess.Popen, Watchdog, threading.Thread]:
    """`slotune run` as the unit runs it, and systemd's side of its sd_notify."""
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(config.parent / "notify"))
    watchdog = Watchdog(notify)
    listener = threading.Thread(target=watchdog.run, daemon=True)
    listener.start()
    env = dict(os.environ, NOTIFY_SOCKET=str(config.parent / "notify"), WATCHDOG_USEC=str(int(WATCHDOG_S * 1e6)))
    env.pop("WATCHDOG_PID", None)
    with open(config.parent / "daemon.log", "wb") as log:
        daemon = subprocess.Popen(sandboxed([sys.executable, "-m", "slotune.cli", "run", "--config", str(config)], work),
                                  cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    return daemon, watchdog, listener


def measure(daemon: subprocess.Popen, url: str, seconds: float, quiet: float, point: Point, here: Path) -> None:
    """Scrape each second over the window (the last body kept in here/metrics.txt); the daemon's CPU
    over the window and its RSS at its end; then its CPU over `quiet` seconds without a scrape, and
    (one scrape after them) its ticks late meanwhile."""
    cpu0, t0 = cpu_seconds(daemon.pid), time.monotonic()
    for k in range(1, int(seconds) + 1):
        (here / "metrics.txt").write_bytes(scrape(url, point))
        time.sleep(max(t0 + k - time.monotonic(), 0))
        if daemon.poll() is not None:
            return
    point.cpu_pct = 100 * (cpu_seconds(daemon.pid) - cpu0) / (time.monotonic() - t0)
    point.rss_mib = sample(daemon.pid, 0.0).rss_mib
    cpu0, t0 = cpu_seconds(daemon.pid), time.monotonic()
    while time.monotonic() - t0 < quiet and daemon.poll() is None:
        time.sleep(0.5)
    if daemon.poll() is None:
        point.quiet_pct = 100 * (cpu_seconds(daemon.pid) - cpu0) / (time.monotonic() - t0)
        after = Point(point.services, point.conns)
        scrape(url, after)
        if after.late and point.late:
            point.late_quiet = after.late[-1] - point.late[-1]


def run_point(work: Path, s: int, c: int, flood_port: int, args, started: list[subprocess.Popen]) -> Point:
    point, here = Point(s, c), work / f"s{s}-c{c}"
    here.mkdir()
    exporter_port, *ports = launcher.free_ports(s + 1)
    say(s, c, f"starting {s} service process{'es' * (s > 1)} and their load ({args.rate:g} req/s each)")
    services = start_services(ports)
    started += services
    load = start_load(args.rate, ports)
    started.append(load)
    config = here / "slotune.toml"
    # the flood service: its processes found by port, its connections in the kernel's view; no /metrics
    config.write_text(config_text(here, exporter_port, {f"svc-{i}": (p, True) for i, p in enumerate(ports)}) +
                      f"\n[services.flood]\nport = {flood_port}\nslo_p99_ms = 100\n")
    launched = time.monotonic()
    daemon, watchdog, listener = start_daemon(work, config)
    started.append(daemon)
    try:
        while not watchdog.ready.wait(0.5):
            if daemon.poll() is not None or time.monotonic() - launched > READY_S:
                point.died = f"no READY=1 (exit {daemon.poll()})"
                return point
        point.ready_s = time.monotonic() - launched
        say(s, c, f"daemon READY=1 after {point.ready_s:.1f} s; warm-up {args.warmup:g} s")
        time.sleep(args.warmup)
        if daemon.poll() is None:
            say(s, c, f"measuring {args.seconds:g} s, then {args.quiet:g} s without scrapes")
            measure(daemon, f"http://127.0.0.1:{exporter_port}/metrics", args.seconds, args.quiet, point, here)
        if daemon.poll() is not None:
            point.died = f"exited {daemon.returncode} during the run"
        elif watchdog.misses:
            point.died = f"{watchdog.misses} watchdog misses"
    finally:
        try:
            stop_daemon(daemon)            # SIGTERM, as systemd stops it
        except subprocess.TimeoutExpired:
            daemon.kill()
        rc = daemon.wait()
        watchdog.stopped.set()
        listener.join()
        watchdog.sock.close()
        point.load = stop_load(load)
        kill_all(services)
        times = decisions(here / "audit.jsonl", [f"svc-{i}" for i in range(s)])[0]
        point.missed = sum(missed(t) for t in times.values()) + sum(1 for t in times.values() if not t)
        if point.died:
            log = (here / "daemon.log").read_text(errors="replace")
            print(f"the daemon {point.died}; the end of its log ({here / 'daemon.log'}):\n{log[-3000:]}", flush=True)
        elif rc != 0:
            point.died = f"exit {rc} on SIGTERM"
    say(s, c, f"CPU {point.cpu_pct:.1f} % of a core ({point.quiet_pct:.1f} % unscraped), RSS {point.rss_mib:.0f} MiB, ticks P99 {point.tick_ms(0.99):.0f} ms, "
              f"{point.series} series, processes found for {point.found} of {s + 1} services, {point.missed} "
              f"tuner intervals missed; load: {point.load}")
    return point


def say(s: int, c: int, what: str) -> None:
    print(f"  [{datetime.now(timezone.utc):%H:%M:%S} S={s} C={c}] {what}", flush=True)


# ---- the report ----

def table(points: list[Point]) -> str:
    cols = [("S", "", 4), ("C", "", 6), ("CPU %", "", 6), ("quiet", "CPU %", 6), ("RSS", "MiB", 5),
            ("tick", "med ms", 6), ("tick", "P99 ms", 6), ("late", "", 4), ("late", "quiet", 5),
            ("series", "", 6), ("body", "KiB", 5), ("scrape", "ms", 6), ("found", "", 5), ("missed", "", 6),
            ("map", "full", 6), ("map", "evicted", 7)]
    rows = [" ".join(f"{h:>{w}}" for h, _, w in cols) + "  maps that lost entries",
            " ".join(f"{u:>{w}}" for _, u, w in cols)]
    for p in points:
        lost = ", ".join(sorted({k.split('"')[1] for k in p.maps if '"' in k})) or "-"
        values = [f"{p.services}", f"{p.conns}", f"{p.cpu_pct:.1f}", f"{p.quiet_pct:.1f}", f"{p.rss_mib:.0f}",
                  f"{p.tick_ms(0.5):.0f}", f"{p.tick_ms(0.99):.0f}",
                  f"{p.late[-1] - p.late[0]:.0f}" if p.late else "-", f"{p.late_quiet:.0f}", f"{p.series}",
                  f"{p.body_bytes / 1024:.0f}", f"{statistics.median(p.scrape_s) * 1e3:.0f}" if p.scrape_s else "-",
                  f"{p.found}", f"{p.missed}", f"{p.map_total(MAP_PREFIX + 'full'):.0f}",
                  f"{p.map_total(MAP_PREFIX + 'evicted'):.0f}"]
        rows.append(" ".join(f"{v:>{w}}" for v, (_, _, w) in zip(values, cols)) + f"  {lost}"
                    + (f"  (scrapes failed: {p.scrape_failures})" if p.scrape_failures else ""))
    return "\n".join(rows) + """

CPU %: of one core, the daemon's /metrics scraped each second; quiet CPU %: over the seconds after, not scraped
late: ticks longer than the 1 s collect interval (slotune_ticks_late_total) in the window; late quiet: in the
  unscraped seconds after it
found: services the daemon found processes for, of S + 1; missed: tuner intervals (2 s) without a decision,
  over all S services and the daemon's whole run"""


def fits(points: list[Point]) -> str:
    """Least squares cost = a + b*S + c*(C/10 000) for CPU, RSS and tick P99, and the slope between
    consecutive S at each C (does a service cost more when there are more of them?)."""
    ok = [p for p in points if not p.died]
    out = []
    for label, unit, value in (("CPU", "% of a core", lambda p: p.cpu_pct),
                               ("quiet CPU", "% of a core", lambda p: p.quiet_pct), ("RSS", "MiB", lambda p: p.rss_mib),
                               ("tick P99", "ms", lambda p: p.tick_ms(0.99))):
        xs = np.array([[1.0, p.services, p.conns / 1e4] for p in ok])
        ys = np.array([value(p) for p in ok])
        if len({p.services for p in ok}) < 2 or len(ok) < 3:
            out.append(f"  {label}: too few points to fit")
            continue
        coef, *_ = np.linalg.lstsq(xs, ys, rcond=None)
        resid = float(np.max(np.abs(xs @ coef - ys)))
        out.append(f"  {label:<9} {coef[0]:8.2f} {unit} + {coef[1]:7.3f} per service + {coef[2]:7.2f} per 10 000 "
                   f"connections (largest residual {resid:.2f})")
        for c in sorted({p.conns for p in ok}):
            at = sorted((p for p in ok if p.conns == c), key=lambda p: p.services)
            steps = [f"{a.services}->{b.services}: {(value(b) - value(a)) / (b.services - a.services):.3f}"
                     for a, b in zip(at, at[1:])]
            if steps:
                out.append(f"  {'':<9} per service at C={c}, between consecutive S: {', '.join(steps)}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["load"]:           # the load's own process
        asyncio.run(_load(float(argv[1]), [int(p) for p in argv[2:]]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--services", type=int, nargs="+", default=[1, 10, 50], help="S: services watched and tuned")
    ap.add_argument("--conns", type=int, nargs="+", default=[0, 20_000], help="C: idle loopback connections held")
    ap.add_argument("--seconds", type=float, default=30.0, help="measured window per point")
    ap.add_argument("--quiet", type=float, default=10.0, help="then seconds without scrapes, for the CPU alone")
    ap.add_argument("--warmup", type=float, default=20.0, help="seconds after READY=1 before the window")
    ap.add_argument("--rate", type=float, default=2.0, help="GET requests/s to each service (open loop)")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("bench.scale needs root: the daemon loads BPF programs", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="slotune-scale-"))
    began = datetime.now(timezone.utc)
    print(f"scale: S {args.services} x C {args.conns}, warm-up {args.warmup:g} s + {args.seconds:g} s measured "
          f"+ {args.quiet:g} s unscraped a point, {args.rate:g} req/s a service; work dir {work}", flush=True)
    points: list[Point] = []
    started: list[subprocess.Popen] = []
    try:
        for c in args.conns:            # C outside: the held connections are opened and closed once each
            flood_port = launcher.free_ports(1)[0]
            print(f"holding {c} idle connections to the flood service's port {flood_port} ...", flush=True)
            holders = hold_idle(flood_port, c)
            started += holders
            for s in args.services:
                points.append(run_point(work, s, c, flood_port, args, started))
                if points[-1].died:
                    break
            kill_all(holders)
            if points and points[-1].died:
                break
    finally:
        kill_all(started)          # run_point stopped its daemon with SIGTERM; this is what is left, if any
    print(f"\nscale, {began:%Y-%m-%d %H:%M}-{datetime.now(timezone.utc):%H:%M} UTC, warm-up {args.warmup:g} s + "
          f"{args.seconds:g} s measured + {args.quiet:g} s unscraped a point, {args.rate:g} req/s a service, S services + 1 holding C idle "
          f"connections, under the unit's sandbox\n")
    print(table(points))
    print("\nfitted (least squares over the points): cost = a + b*S + c*(C/10 000)")
    print(fits(points))
    died = [p for p in points if p.died]
    for p in died:
        print(f"the daemon at S={p.services} C={p.conns}: {p.died}")
    return 1 if died else 0


if __name__ == "__main__":
    sys.exit(main())
