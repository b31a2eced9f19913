"""Chaos: does a bad service cost only itself? A real `slotune run`, under the
shipped unit's capabilities and file-system view (bench/unit_sandbox.py), kernel
probes on, tunes 3 healthy services while 10 hostile ones answer the way broken
or malicious services do (bench/chaos_services.py): a control answer nested
100 000 deep, histogram counts of 1.5e308, lines of 12 000 labels, a 4 MiB body
at a byte a second, a control surface that answers after 40 s, garbage,
redirects, 5 MiB answers, a service restarted every 5 s and one holding 100 000
idle connections. Meanwhile the wall clock steps +60 s and back every 2 minutes,
the daemon gets a SIGHUP every second, 200 idle connections sit on its exporter,
and this process plays systemd's watchdog (WatchdogSec=30, honouring the
daemon's WATCHDOG_USEC= while a push runs).

It checks, and prints: every healthy service decided at every tuner interval
(none missed), the daemon never restarted nor missed its watchdog, every audit
line parses, the exporter answered /metrics within 1 s, over the whole run; and
RSS and open fds flat over the measured minutes (last quarter within 5 % of the
first), which follow a warm-up as long as the daemon's window history
(HISTORY_S, 10 min: while it fills, RSS grows ~15 MiB a service by design).
Exit 1 when a check fails.

    python -m bench.chaos                  # 10 min warm-up + 10 min measured, 100 000 idle connections
    python -m bench.chaos --warmup-minutes 1 --minutes 2 --idle 20000    # a quick look"""
from __future__ import annotations

import argparse
import json
import os
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

from bench.chaos_services import INSTANT, SLOW, Healthy, Hostile, flood
from bench.soak import sample
from bench.unit_sandbox import sandboxed
from slotune.process import HISTORY_S
from reference_stack import launcher

ROOT = Path(__file__).resolve().parents[1]
TUNE_S = 2.0              # every service's throttle decides this often
WATCHDOG_S = 30.0         # the shipped unit's WatchdogSec=
CLOCK_STEP_S = 60.0
CLOCK_EVERY_S = 120.0     # +60 s, then back 60 s a minute later
EXPORTER_IDLE = 200
W = 44                    # the report's first column


def service_toml(name: str, port: int, control: bool) -> str:
    text = f"""
[services.{name}]
port = {port}
slo_p99_ms = 100
metrics_url = "http://127.0.0.1:{port}/metrics"
latency_metric = "svc_request_duration_seconds"
"""
    if control:
        text += f"""[services.{name}.control]
kind = "http-json"
url = "http://127.0.0.1:{port}/admin/config"
[services.{name}.tuners.throttle]
policy = "whitepaper"
interval_s = {TUNE_S}
[services.{name}.settings.rate_limit_rps]
min = 1.0
max = 100000.0
max_step = 10000.0
"""
    return text


def config_text(work: Path, exporter_port: int, services: dict[str, tuple[int, bool]]) -> str:
    return f"""[daemon]
collect_interval_s = 1.0
exporter_address = "127.0.0.1:{exporter_port}"
baseline_store = "{work}/baselines.sqlite"
audit_log = "{work}/audit.jsonl"
state_file = "{work}/state.json"
""" + "".join(service_toml(name, port, control) for name, (port, control) in services.items())


@dataclass
class Watchdog:
    """systemd's side of sd_notify: the longest silence against the allowance in force."""
    sock: socket.socket
    allowance_s: float = WATCHDOG_S
    last_ping: float = field(default_factory=time.monotonic)
    worst_ratio: float = 0.0       # longest silence / the allowance then in force
    misses: int = 0
    ready: threading.Event = field(default_factory=threading.Event)
    stopped: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        self.sock.settimeout(0.2)
        while not self.stopped.is_set():
            try:
                message = self.sock.recv(4096).decode(errors="replace")
            except TimeoutError:
                message = ""
            now = time.monotonic()
            if self.ready.is_set():
                ratio = (now - self.last_ping) / self.allowance_s
                self.worst_ratio = max(self.worst_ratio, ratio)
                if ratio > 1.0:
                    self.misses += 1
                    self.last_ping = now      # systemd would have restarted it here
            for line in message.split("\n"):
                key, _, value = line.partition("=")
                if key == "READY":
                    self.ready.set()
                    self.last_ping = now
                elif key == "WATCHDOG":
                    self.last_ping = now
                elif key == "WATCHDOG_USEC":
                    self.allowance_s = int(value) / 1e6


class Every(threading.Thread):
    """Calls fn() every period_s until stopped; counts the calls."""

    def __init__(self, period_s: float, fn):
        super().__init__(daemon=True)
        self.period_s, self.fn, self.stopped, self.calls = period_s, fn, threading.Event(), 0

    def run(self) -> None:
        while not self.stopped.wait(self.period_s):
            self.fn()
            self.calls += 1


class ClockSteps:
    """+60 s, a minute later -60 s: the wall clock is back where it was after each pair."""

    def __init__(self):
        self.net_s, self.steps = 0.0, 0

    def step(self) -> None:
        by = -CLOCK_STEP_S if self.net_s else CLOCK_STEP_S
        time.clock_settime(time.CLOCK_REALTIME, time.time() + by)
        self.net_s += by
        self.steps += 1

    def undo(self) -> None:
        if self.net_s:
            time.clock_settime(time.CLOCK_REALTIME, time.time() - self.net_s)
            self.net_s = 0.0


class Restarting:
    """A healthy service as its own process, killed and started again every few seconds (new pid)."""

    def __init__(self, port: int):
        self.port, self.proc, self.restarts = port, None, 0
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.chaos_services", "healthy", str(self.port)],
                                     cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.proc.stdout.readline()      # "ready"

    def restart(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.start()
        self.restarts += 1


class Scrapes:
    """GET /metrics of the daemon each second: the slowest answer, the failures, and the
    longest tick the daemon reported."""

    def __init__(self, url: str):
        self.url, self.times, self.failures, self.ticks, self.stages = url, [], 0, [], []

    def scrape(self) -> None:
        began = time.monotonic()
        try:
            with urllib.request.urlopen(self.url, timeout=10) as resp:
                body = resp.read().decode()
            self.times.append(time.monotonic() - began)
        except OSError:
            self.failures += 1
            return
        self.ticks += [float(line.split()[1]) for line in body.splitlines()
                       if line.startswith("slotune_tick_duration_seconds ")]
        self.stages = [line for line in body.splitlines()
                       if line.startswith("slotune_service_stage_seconds{") and 'which="longest"' in line]


def stage_of(line: str) -> str:
    """'name stage 1234 ms' of a slotune_service_stage_seconds line."""
    labels = dict(part.split("=", 1) for part in line[line.index("{") + 1:line.index("}")].split(","))
    return f"{labels['service'].strip(chr(34))} {labels['stage'].strip(chr(34))} " \
           f"{float(line.rsplit(' ', 1)[1]) * 1e3:.0f} ms"


def decisions(audit: Path, names: list[str]) -> tuple[dict[str, list[float]], int, int]:
    """({service: its throttle's decision times}, audit lines, lines that parse)."""
    times, lines, parsed = {n: [] for n in names}, 0, 0
    for line in audit.read_text(errors="replace").splitlines() if audit.exists() else []:
        lines += 1
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        parsed += 1
        if entry.get("service") in times and entry.get("tuner") == "throttle":
            times[entry["service"]].append(float(entry["t"]))
    return {n: sorted(set(ts)) for n, ts in times.items()}, lines, parsed


def missed(times: list[float]) -> int:
    """Tuner intervals without a decision, between the first decision and the last."""
    return sum(max(0, int((b - a) / TUNE_S + 0.25) - 1) for a, b in zip(times, times[1:]))


def quarter_medians(values: list[float]) -> tuple[float, float]:
    """Medians of the first and the last quarter."""
    q = max(len(values) // 4, 1)
    return statistics.median(values[:q]), statistics.median(values[-q:])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10.0, help="measured, after the warm-up")
    ap.add_argument("--warmup-minutes", type=float, default=HISTORY_S / 60)
    ap.add_argument("--idle", type=int, default=100_000, help="idle connections held to one hostile service")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench.chaos needs root: the daemon loads BPF and the bench steps the clock", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="slotune-chaos-"))
    ports = launcher.free_ports(4)
    exporter_port, restarting_port, flood_port = ports[0], ports[1], ports[2]
    healthy = {f"healthy-{i}": Healthy() for i in range(3)}
    hostile = {kind: Hostile(kind) for kind in (*INSTANT, *SLOW)}
    restarting = Restarting(restarting_port)
    print(f"holding {args.idle} idle connections to hostile service idle-flood ...", flush=True)
    holders = flood(flood_port, args.idle)
    services = {name: (s.port, True) for name, s in healthy.items()}
    services |= {name: (s.port, name not in ("huge-numbers", "many-labels")) for name, s in hostile.items()}
    services |= {"restarting": (restarting_port, True), "idle-flood": (flood_port, False)}
    (work / "slotune.toml").write_text(config_text(work, exporter_port, services))

    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(work / "notify"))
    watchdog = Watchdog(notify)
    threading.Thread(target=watchdog.run, daemon=True).start()
    env = dict(os.environ, NOTIFY_SOCKET=str(work / "notify"), WATCHDOG_USEC=str(int(WATCHDOG_S * 1e6)))
    env.pop("WATCHDOG_PID", None)
    log = open(work / "daemon.log", "wb")
    daemon = subprocess.Popen(sandboxed([sys.executable, "-m", "slotune.cli", "run", "--config",
                                         str(work / "slotune.toml")], work), cwd=ROOT, env=env,
                              stdout=log, stderr=subprocess.STDOUT)
    clock, samples, started = ClockSteps(), [], None
    scrapes = Scrapes(f"http://127.0.0.1:{exporter_port}/metrics")
    idle = []
    try:
        if not watchdog.ready.wait(120):
            print(f"the daemon did not say READY=1 within 120 s; its log:\n{(work / 'daemon.log').read_text()[-3000:]}")
            return 1
        pid = daemon.pid
        idle = [socket.create_connection(("127.0.0.1", exporter_port)) for _ in range(EXPORTER_IDLE)]
        chores = [Every(1.0, scrapes.scrape), Every(1.0, lambda: daemon.send_signal(signal.SIGHUP)),
                  Every(5.0, restarting.restart), Every(CLOCK_EVERY_S / 2, clock.step)]
        for c in chores:
            c.start()
        started = time.monotonic()
        warm, total = args.warmup_minutes * 60, (args.warmup_minutes + args.minutes) * 60
        while time.monotonic() < started + total and daemon.poll() is None:
            t = time.monotonic() - started
            if t >= warm:
                samples.append(sample(daemon.pid, t))
            got = sample(daemon.pid, t)
            print(f"\r  {t:5.0f} s of {total:.0f} ({'measured' if t >= warm else 'warm-up'}): RSS {got.rss_mib:.0f} MiB, "
                  f"{got.fds} fds, {restarting.restarts} restarts, {chores[1].calls} SIGHUPs   ", end="", flush=True)
            time.sleep(min(5.0, max(started + total - time.monotonic(), 0)))
        print()
        for c in chores:
            c.stopped.set()
        survived = daemon.poll() is None and daemon.pid == pid
    finally:
        clock.undo()
        for c in idle:
            c.close()
        if daemon.poll() is None:
            daemon.send_signal(signal.SIGTERM)
            try:
                daemon.wait(30)
            except subprocess.TimeoutExpired:
                daemon.kill()
        watchdog.stopped.set()
        log.close()
        for p in holders:
            p.kill()
        restarting.proc.kill()
        for s in (*healthy.values(), *hostile.values()):
            s.close()
    return report(args, work, healthy, samples, scrapes, watchdog, clock, survived, daemon.returncode)


def report(args, work: Path, healthy: dict, samples: list, scrapes: Scrapes, watchdog: Watchdog,
           clock: ClockSteps, survived: bool, rc: int) -> int:
    times, lines, parsed = decisions(work / "audit.jsonl", list(healthy))
    text = (work / "daemon.log").read_text(errors="replace")
    rss1, rss4 = quarter_medians([s.rss_mib for s in samples])
    fds1, fds4 = quarter_medians([float(s.fds) for s in samples])
    slowest = max(scrapes.times, default=float("inf"))
    checks = [
        ("healthy services' decisions missed", sum(missed(t) for t in times.values()) == 0 and all(times.values()),
         ", ".join(f"{n}: {len(t)} decisions, {missed(t)} missed" for n, t in times.items())),
        ("the daemon ran throughout (same pid)", survived and watchdog.misses == 0,
         f"watchdog misses {watchdog.misses}, longest silence {watchdog.worst_ratio:.2f} of its allowance"),
        ("audit lines that parse", lines == parsed and lines > 0, f"{parsed} of {lines}"),
        ("RSS, first vs last quarter measured (median)", rss4 <= rss1 * 1.05, f"{rss1:.0f} -> {rss4:.0f} MiB"),
        ("open fds, first vs last quarter measured", fds4 <= fds1 * 1.05, f"{fds1:.0f} -> {fds4:.0f}"),
        ("exporter: slowest /metrics, failures", slowest < 1.0 and scrapes.failures == 0,
         f"{slowest * 1e3:.0f} ms of {len(scrapes.times)} scrapes, {scrapes.failures} failed"),
        ("exit status on SIGTERM", rc == 0, str(rc)),
    ]
    print(f"\nchaos, {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {args.warmup_minutes:g} min warm-up + "
          f"{args.minutes:g} min measured, {args.idle} idle connections, {clock.steps} clock steps of "
          f"{CLOCK_STEP_S:.0f} s, SIGHUP every 1 s, work dir {work}")
    ticks = sorted(scrapes.ticks)
    if ticks:
        print(f"  the daemon's ticks (from its /metrics, each second): median {statistics.median(ticks) * 1e3:.0f} ms, "
              f"P99 {ticks[int(0.99 * (len(ticks) - 1))] * 1e3:.0f} ms, longest {ticks[-1] * 1e3:.0f} ms")
    slowest = sorted(scrapes.stages, key=lambda line: -float(line.rsplit(" ", 1)[1]))[:4]
    print("  slowest stages (service stage longest): " + ", ".join(stage_of(line) for line in slowest))
    print(f"  said in the log: {text.count('failed (')} stage failures, "
          f"{text.count('Traceback')} tracebacks (each said once per service and cause)")
    for what, ok, figure in checks:
        print(f"  {'ok  ' if ok else 'FAIL'} {what:<{W}} {figure}")
    return 0 if all(ok for _, ok, _ in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
