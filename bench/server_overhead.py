"""What the probes cost a busy real server: a real nginx (1 worker, keep-alive,
a 1 KiB static file, or a 5 ms handler from the echo module) under `wrk -t1
-c16`, and the reference gateway under its closed-loop clients, with variants
alternating round by round: no tracing; slotune with all families watching the
server; slotune's `http` family alone, and with the server's requests classed by
two routes; all families loaded but watching nothing (the cost to the host's
other tenants); and the anchor, a bpftrace syscall-latency histogram for the
server's pid. Each traced run is compared
with the mean of the untraced runs on either side of it; the figures are
medians over the rounds with their range and a 95 % bootstrap interval of the
median, the server's CPU per request, and (--bpf-stats) the kernel's own run
time of each slotune program per request. --targets keeps only what the
issue's targets compare (watching nginx, watching nothing, bpftrace) and an A/A
run, for many short rounds; --compare TREE adds the slotune of another checkout
(an earlier commit) side by side, watching nginx (with --targets, watching
nothing too).
--redis adds a real redis-server under `redis-benchmark -t get,set -c 16`, one
command a round trip and 16 pipelined (the `redis` family walks every command).
--sched-pipe adds a context-switch-heavy process slotune does not watch
(`perf bench sched pipe`), beside bpftrace's runqlat; --empty adds empty
programs on slotune's attach points, what attaching there costs alone.

    python -m bench.server_overhead [--rounds 5] [--seconds 5] [--handler static|sleep|both]
                                    [--gateway] [--redis] [--sched-pipe] [--empty] [--targets] [--bpf-stats]
                                    [--compare TREE]"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from bench.probe_overhead import EmptyPrograms, all_attach_points, empty
from slotune.collectors.kernel import KernelCollector
from slotune.collectors.kernel.program_cost import STATS_SYSCTL
from slotune.model.service import ServiceSpec

NGINX_CONF = """\
load_module /usr/lib/nginx/modules/ngx_http_echo_module.so;
worker_processes 1;
daemon off;
master_process on;
user root;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    keepalive_requests 1000000;
    client_body_temp_path {prefix}/body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    server {{
        listen 127.0.0.1:{port};
        root {prefix}/www;
        location = /static.html {{ }}
        location = /sleep {{ echo_sleep 0.005; echo ok; }}
    }}
}}
"""
PATHS = {"static": "/static.html", "sleep": "/sleep"}
BPFTRACE = ("tracepoint:raw_syscalls:sys_enter /pid == {pid}/ {{ @start[tid] = nsecs; }} "
            "tracepoint:raw_syscalls:sys_exit /pid == {pid} && @start[tid]/ "
            "{{ @ns = hist(nsecs - @start[tid]); delete(@start[tid]); }}")
# runqlat as bpftrace's own tools/runqlat.bt does it: wake-up or preemption to running.
RUNQLAT = ("tracepoint:sched:sched_wakeup,tracepoint:sched:sched_wakeup_new {{ @qtime[args->pid] = nsecs; }} "
           "tracepoint:sched:sched_switch {{ if (args->prev_state == 0) {{ @qtime[args->prev_pid] = nsecs; }} "
           "$ns = @qtime[args->next_pid]; if ($ns) {{ @usecs = hist((nsecs - $ns) / 1000); }} "
           "delete(@qtime[args->next_pid]); }}")
PIPE_LOOPS = 100_000    # perf bench sched pipe round trips a run (~1.5 s here)


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Nginx:
    """A private nginx serving /static.html (1 KiB) and /sleep (5 ms, echo module)."""

    def __init__(self, work: Path, cpu: int | None):
        self.prefix, self.port = work / "nginx", free_port()
        for d in ("www", "body", "proxy", "fastcgi", "uwsgi", "scgi"):
            (self.prefix / d).mkdir(parents=True, exist_ok=True)
        (self.prefix / "www" / "static.html").write_bytes(b"x" * 1024)
        conf = self.prefix / "nginx.conf"
        conf.write_text(NGINX_CONF.format(prefix=self.prefix, port=self.port))
        pin = ["taskset", "-c", str(cpu)] if cpu is not None else []
        self.master = subprocess.Popen([*pin, "nginx", "-p", str(self.prefix), "-c", str(conf)])
        deadline = time.monotonic() + 10
        while not self.workers():
            if self.master.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"nginx did not start; see {self.prefix / 'error.log'}")
            time.sleep(0.1)
        self.worker = self.workers()[0]

    def workers(self) -> list[int]:
        try:
            children = Path(f"/proc/{self.master.pid}/task/{self.master.pid}/children").read_text().split()
        except OSError:
            return []
        return [int(c) for c in children]

    def url(self, handler: str) -> str:
        return f"http://127.0.0.1:{self.port}{PATHS[handler]}"

    def stop(self) -> None:
        self.master.terminate()
        self.master.wait(timeout=10)


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wrk(url: str, seconds: float, cpu: int | None) -> float:
    pin = ["taskset", "-c", str(cpu)] if cpu is not None else []
    out = subprocess.run([*pin, "wrk", "-t1", "-c16", f"-d{seconds:g}s", url],
                         capture_output=True, text=True, check=True).stdout
    m = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if not m:
        raise RuntimeError(f"wrk printed no rate:\n{out}")
    return float(m.group(1))


@dataclass
class Run:
    rps: float
    cpu_us: float                       # server CPU per request, µs
    bpf_ns: dict = field(default_factory=dict)   # BPF program -> run time ns in the run ("<name> runs": runs)


class Tracer:
    """One variant: set up before a run, torn down after (outside the measured time)."""
    name = ""

    def start(self, target: "Target") -> None: ...
    def stop(self) -> None: ...
    def close(self) -> None: ...


class Slotune(Tracer):
    """A KernelCollector as the daemon runs it, collect() every second in a thread.
    Compiled once; between its runs its probes are detached (the maps stay)."""

    def __init__(self, name: str, families: list[str] | None, watch: bool, *, routes: tuple[str, ...] = ()):
        self.name, self.families, self.watch, self.routes = name, families, watch, routes
        self.collector, self.detached = None, []

    def start(self, target):
        if self.collector is None:
            spec = (replace(target.spec, routes=self.routes) if self.watch else
                    ServiceSpec("nobody", cmdline=f"no-such-process-{uuid.uuid4().hex}"))
            self.collector = KernelCollector(self.families)
            self.collector.start([spec])
            if not self.collector.up:
                raise SystemExit(f"slotune probes did not load: {self.collector.start_error}")
        for a in self.detached:
            self.collector.program.attach(a)
        self.collector.refresh()
        self.halt = threading.Event()
        self.ticker = threading.Thread(target=self._tick, daemon=True)
        self.ticker.start()

    def _tick(self):
        i = 0
        while not self.halt.wait(1.0):
            self.collector.collect(float(i), float(i + 1))
            i += 1

    def stop(self):
        self.halt.set()
        self.ticker.join()
        self.detached = self.collector.program.detach_all()

    def close(self):
        if self.collector is not None:
            self.collector.close()


HOLD = """import sys, threading
from slotune.collectors.kernel import KernelCollector
from slotune.model.service import ServiceSpec
c = KernelCollector(None)
c.start([ServiceSpec("server", port=int(sys.argv[1]))])
print("up" if c.up else "down " + c.start_error, flush=True)
halt = threading.Event()
def tick():
    i = 0
    while not halt.wait(1.0):
        c.collect(float(i), float(i + 1)); i += 1
threading.Thread(target=tick, daemon=True).start()
sys.stdin.readline()
halt.set()
c.close()
"""


class OtherTree(Tracer):
    """All families, as the slotune checked out in another folder (an earlier commit:
    `git worktree add /tmp/before <commit>`) has them, in a process of its own, watching the
    server or (watch=False) a port nothing listens on."""

    def __init__(self, tree: Path, watch: bool = True):
        self.watch = watch
        watching = "watching nginx" if watch else "watching nothing"
        git = ["git", "-C", str(tree)]
        commit = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        edited = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True).stdout.strip()
        # Named by its commit, and by its folder where it holds changes not committed: two
        # edited trees of one commit are two variants, not one row of both trees' runs.
        at = f"{commit} as edited in {tree}" if commit and edited else commit or str(tree)
        self.tree, self.name = tree, f"slotune at {at}, all families, {watching}"

    def start(self, target):
        port = target.port if self.watch else free_port()
        self.proc = subprocess.Popen([sys.executable, "-c", HOLD, str(port)], cwd=self.tree,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline().strip()
        if line != "up":
            raise SystemExit(f"slotune in {self.tree} did not load: {line}")

    def stop(self):
        self.proc.communicate("stop\n", timeout=60)


class Bpftrace(Tracer):
    """A bpftrace script, {pid} the server's: the syscall histogram unless told another."""

    def __init__(self, name: str = "bpftrace syscall-latency histogram, server pid", script: str = BPFTRACE):
        self.name, self.script = name, script

    def start(self, target):
        self.proc = subprocess.Popen(["bpftrace", "-e", self.script.format(pid=target.pid)],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in self.proc.stdout:          # "Attaching 2 probes..." once it is in
            if line.startswith("Attaching"):
                return
        raise SystemExit(f"bpftrace did not start (exit {self.proc.wait()})")

    def stop(self):
        self.proc.send_signal(signal.SIGINT)      # prints its maps and detaches
        try:
            self.proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()


class Empty(Tracer):
    """Empty programs on some of slotune's attach points, attached as slotune attaches them."""

    def __init__(self, name: str, points: list):
        self.name, self.points, self.programs = name, points, None

    def start(self, target):
        if self.programs is None:
            self.programs = EmptyPrograms(self.points)
        self.programs.attach()

    def stop(self):
        self.programs.detach()

    def close(self):
        if self.programs is not None:
            self.programs.bpf.cleanup()


@contextlib.contextmanager
def bpf_stats_on():
    """kernel.bpf_stats_enabled at 1 for the block (the kernel then times every BPF
    program's runs, adding ~20-30 ns to each), put back as it was after."""
    was = STATS_SYSCTL.read_text().strip()
    STATS_SYSCTL.write_text("1")
    try:
        yield
    finally:
        STATS_SYSCTL.write_text(was)


def program_runs() -> dict[str, tuple[int, int]]:
    """name -> (run_time_ns, run_cnt) summed over every BPF program loaded on the host
    (kernel.bpf_stats_enabled): any variant's, slotune's, another checkout's or bpftrace's."""
    out: dict[str, tuple[int, int]] = {}
    for p in json.loads(subprocess.run(["bpftool", "-j", "prog", "show"], capture_output=True,
                                       text=True, check=True).stdout):
        name = p.get("name") or f"id {p['id']}"
        t, n = out.get(name, (0, 0))
        out[name] = (t + p.get("run_time_ns", 0), n + p.get("run_cnt", 0))
    return out


def runs_between(before: dict, after: dict) -> dict:
    """The run time and runs of the programs that ran between two program_runs()."""
    out = {}
    for name, (t, n) in after.items():
        t0, n0 = before.get(name, (0, 0))
        if n > n0:
            out[name], out[f"{name} runs"] = t - t0, n - n0
    return out


@dataclass
class Target:
    """What the variants run against: one measured run returns requests/s and CPU per request."""
    spec: ServiceSpec
    pid: int
    port: int
    measure: object                     # () -> (requests/s, server CPU µs per request)


def alternate(target: Target, tracers: list[Tracer], rounds: int, stats: bool = False) -> dict[str, list[Run]]:
    """Per round: untraced, tracer 1, untraced, tracer 2, ..., untraced (the order of the
    tracers rotates each round). Each traced run is kept with the untraced runs beside it,
    and with `stats` the BPF programs' run time in it."""
    out: dict[str, list[tuple[Run, Run, Run]]] = {t.name: [] for t in tracers}
    names = [t.name for t in tracers]
    if twice := sorted({n for n in names if names.count(n) > 1}):
        raise SystemExit(f"variants of one name, whose runs would make one row: {'; '.join(twice)}")
    for r in range(rounds):
        order = tracers[r % len(tracers):] + tracers[:r % len(tracers)]
        before = Run(*target.measure())
        for t in order:
            t.start(target)
            try:
                before_runs = program_runs() if stats else {}
                run = Run(*target.measure())
                if stats:
                    run.bpf_ns = runs_between(before_runs, program_runs())
            finally:
                t.stop()
            after = Run(*target.measure())
            out[t.name].append((before, run, after))
            before = after
        print(f"  round {r + 1}/{rounds} done", file=sys.stderr, flush=True)
    return out


def median_ci(values: list[float], resamples: int = 4000) -> tuple[float, float]:
    """A 95 % bootstrap interval of the median (rounds resampled with replacement): how
    far the median of this many rounds could sit from the one a longer run would give."""
    rng = np.random.default_rng(0)
    medians = np.median(rng.choice(np.asarray(values), size=(resamples, len(values))), axis=1)
    return float(np.quantile(medians, 0.025)), float(np.quantile(medians, 0.975))


def report(title: str, results: dict, seconds: float, unit: str = "req") -> list[str]:
    """The table of one server: ratios, rates and CPU per request (or per `unit`), then
    with --bpf-stats each variant's BPF run time per program (divided by the requests of `seconds`)."""
    w = max(52, *map(len, results))     # the variant column fits the longest name
    lines = [f"\n{title}", f"{'variant':<{w}} {f'{unit}/s vs untraced':>18} {'[min-max]':>13} {'95% CI':>13} "
                           f"{f'{unit}/s':>8} {f'CPU µs/{unit}':>11} {f'kept by CPU/{unit}':>16} {'[min-max]':>13}"]
    base_rps = [b.rps for runs in results.values() for triple in runs for b in (triple[0], triple[2])]
    base_cpu = [b.cpu_us for runs in results.values() for triple in runs for b in (triple[0], triple[2])]
    lines.append(f"{'no tracing':<{w}} {'1.00':>18} {'':>13} {'':>13} {statistics.median(base_rps):>8.0f} "
                 f"{statistics.median(base_cpu):>11.1f} {'1.00':>16}")
    for name, runs in results.items():
        if not runs:
            continue
        rel = [run.rps / ((b.rps + a.rps) / 2) for b, run, a in runs]
        # The share of throughput a CPU-bound server keeps: untraced CPU per request
        # (its neighbours' mean) over traced: a second estimate beside req/s.
        kept = [((b.cpu_us + a.cpu_us) / 2) / run.cpu_us for b, run, a in runs]
        cpu = statistics.median(run.cpu_us for _, run, _ in runs)
        lo, hi = median_ci(rel)
        lines.append(f"{name:<{w}} {statistics.median(rel):>18.2f} {f'[{min(rel):.2f}-{max(rel):.2f}]':>13} "
                     f"{f'[{lo:.3f}-{hi:.3f}]':>13} "
                     f"{statistics.median(r.rps for _, r, _ in runs):>8.0f} {cpu:>11.1f} "
                     f"{statistics.median(kept):>16.2f} {f'[{min(kept):.2f}-{max(kept):.2f}]':>13}")
    for name, runs in results.items():
        stats = [run for _, run, _ in runs if run.bpf_ns]
        if not stats:
            continue
        lines.append(f"  {name}: kernel BPF run time per request (median of {len(stats)} rounds)")
        fns = sorted({k for s in stats for k in s.bpf_ns if not k.endswith(" runs")})
        total = 0.0
        for fn in fns:
            per_req = statistics.median(s.bpf_ns.get(fn, 0) / (s.rps * seconds) for s in stats)
            runs_per_req = statistics.median(s.bpf_ns.get(f"{fn} runs", 0) / (s.rps * seconds) for s in stats)
            total += per_req
            if per_req >= 1:
                ns_run = per_req / runs_per_req if runs_per_req else 0
                lines.append(f"    {fn:<28} {per_req:>8.0f} ns/req  {runs_per_req:>6.2f} runs/req  "
                             f"{ns_run:>5.0f} ns/run")
        lines.append(f"    {'total':<28} {total:>8.0f} ns/req")
    return lines


def nginx_rounds(args, work: Path) -> list[str]:
    server_cpu, client_cpu = (0, 1) if args.pin else (None, None)
    nginx = Nginx(work, server_cpu)
    out = []
    try:
        spec = ServiceSpec("nginx", port=nginx.port)   # the worker's command line names no config
        for handler in (["static", "sleep"] if args.handler == "both" else [args.handler]):
            url = nginx.url(handler)
            wrk(url, 1, client_cpu)        # warm up

            def measure(url=url):
                c0 = cpu_s(nginx.worker)
                rps = wrk(url, args.seconds, client_cpu)
                return rps, 1e6 * (cpu_s(nginx.worker) - c0) / (rps * args.seconds)

            aa = Empty("nothing attached (A/A: the method's own spread)", [])
            tracers = [Slotune("slotune, all families, watching nginx", None, True),
                       Slotune("slotune, all families, watching nothing", None, False),
                       Bpftrace()]
            if not args.targets:   # --targets: what the targets compare, and the yardstick
                tracers[1:1] = [Slotune("slotune, http only, watching nginx", ["http"], True),
                                Slotune("slotune, http only, watching nginx by 2 routes (its path the 2nd)",
                                        ["http"], True, routes=("/v1/chat/completions", PATHS[handler]))]
            if args.targets or args.empty:
                tracers.append(aa)
            if args.empty:         # the floor: attaching there, doing nothing
                tracers.append(Empty("empty programs on all of slotune's attach points", all_attach_points()))
            tracers += [OtherTree(tree) for tree in args.compare]
            if args.targets:       # the other tree on both targets
                tracers += [OtherTree(tree, watch=False) for tree in args.compare]
            try:
                results = alternate(Target(spec, nginx.worker, nginx.port, measure), tracers, args.rounds,
                                    args.bpf_stats)
            finally:
                for t in tracers:
                    t.close()
            what = "1 KiB static file" if handler == "static" else "5 ms handler (echo_sleep)"
            out += report(f"nginx 1.22, 1 worker, keep-alive, {what}, wrk -t1 -c16, {args.rounds} rounds x "
                          f"{args.seconds:g} s, {'server on CPU 0, wrk on CPU 1' if args.pin else 'unpinned'}",
                          results, args.seconds)
    finally:
        nginx.stop()
    return out


def redis_benchmark(port: int, requests: int, pipeline: int, cpu: int | None) -> float:
    """redis-benchmark's GET and SET, `requests` each, 16 clients: their mean rate, commands/s."""
    pin = ["taskset", "-c", str(cpu)] if cpu is not None else []
    out = subprocess.run([*pin, "redis-benchmark", "-p", str(port), "-t", "get,set", "-n", str(requests), "-c", "16",
                          "-P", str(pipeline), "-r", "100000", "--csv"], capture_output=True, text=True,
                         check=True).stdout
    rates = [float(row.split(",")[1].strip('"')) for row in out.splitlines()[1:] if row.startswith('"')]
    if len(rates) != 2:
        raise RuntimeError(f"redis-benchmark printed no rates:\n{out}")
    return statistics.mean(rates)


def redis_rounds(args, work: Path) -> list[str]:
    server_cpu, client_cpu = (0, 1) if args.pin else (None, None)
    port = free_port()
    pin = ["taskset", "-c", str(server_cpu)] if server_cpu is not None else []
    server = subprocess.Popen([*pin, "redis-server", "--port", str(port), "--save", "", "--appendonly", "no",
                               "--dir", str(work)], stdout=subprocess.DEVNULL)
    out = []
    try:
        deadline = time.monotonic() + 10
        while subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True).returncode:
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("redis-server did not start")
            time.sleep(0.1)
        spec = ServiceSpec("redis", port=port)
        for pipeline in (1, 16):
            rate = redis_benchmark(port, 20000 * pipeline, pipeline, client_cpu)     # warm up, and the pace
            requests = int(rate * args.seconds / 2)      # each of GET and SET: the run lasts about `seconds`

            def measure(requests=requests, pipeline=pipeline):
                c0 = cpu_s(server.pid)
                rps = redis_benchmark(port, requests, pipeline, client_cpu)
                return rps, 1e6 * (cpu_s(server.pid) - c0) / (2 * requests)

            tracers = [Slotune("slotune, all families, watching redis", None, True),
                       Slotune("slotune, redis family only, watching redis", ["redis"], True),
                       Slotune("slotune, all families, watching nothing", None, False),
                       Empty("nothing attached (A/A: the method's own spread)", [])]
            try:
                results = alternate(Target(spec, server.pid, port, measure), tracers, args.rounds, args.bpf_stats)
            finally:
                for t in tracers:
                    t.close()
            out += report(f"redis-server 7, redis-benchmark -t get,set -c 16 -P {pipeline}, {args.rounds} rounds x "
                          f"~{args.seconds:g} s, {'server on CPU 0, client on CPU 1' if args.pin else 'unpinned'}",
                          results, args.seconds, unit="cmd")
    finally:
        server.terminate()
        server.wait(timeout=10)
    return out


def gateway_rounds(args, work: Path) -> list[str]:
    from reference_stack import launcher
    from reference_stack.loadgen import closed_loop
    cfg = launcher.StackConfig.on_free_ports(work / "stack")
    state = launcher.start(cfg)
    try:
        gateway = state["pids"]["gateway"]
        spec = ServiceSpec("gateway", cmdline="reference_stack gateway")
        stack = [pid for name, pid in state["pids"].items() if name != "redis"]

        def measure():
            c0 = sum(cpu_s(p) for p in stack)
            lat = asyncio.run(closed_loop(state["query_url"], 16, args.seconds, seed=0))
            rps = len(lat) / args.seconds
            return rps, 1e6 * (sum(cpu_s(p) for p in stack) - c0) / max(1, len(lat))

        tracers = [Slotune("slotune, all families, watching the gateway", None, True),
                   Slotune("slotune, all families, watching nothing", None, False),
                   Bpftrace()]
        try:
            results = alternate(Target(spec, gateway, state["ports"]["gateway"], measure), tracers, args.rounds,
                                args.bpf_stats)
        finally:
            for t in tracers:
                t.close()
        return report(f"reference gateway (+ inference, tools), 16 closed-loop clients, {args.rounds} rounds x "
                      f"{args.seconds:g} s; CPU µs/req is the whole stack's", results, args.seconds)
    finally:
        launcher.stop(cfg.run_dir)


def pipe_rounds(args, work: Path) -> list[str]:
    """The context-switch-heavy load: `perf bench sched pipe`, both its processes on CPU 0,
    a process slotune does not watch (the cost to the host's other tenants)."""
    import resource

    def measure():
        c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        out = subprocess.run(["taskset", "-c", "0", "perf", "bench", "sched", "pipe", "-l", str(PIPE_LOOPS)],
                             capture_output=True, text=True, check=True).stdout
        c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        m = re.search(r"([\d.]+) ops/sec", out)
        if not m:
            raise RuntimeError(f"perf bench printed no rate:\n{out}")
        cpu = (c1.ru_utime + c1.ru_stime) - (c0.ru_utime + c0.ru_stime)
        return float(m.group(1)), 1e6 * cpu / PIPE_LOOPS

    tracers = [Slotune("slotune, all families, watching nothing", None, False),
               Slotune("slotune, runqueue only, watching nothing", ["runqueue"], False),
               Bpftrace("bpftrace runqlat-style", RUNQLAT)]
    tracers += [OtherTree(tree, watch=False) for tree in args.compare]
    if args.empty:
        points = ("sched:sched_switch", "sched:sched_wakeup", "sched:sched_wakeup_new")
        tracers += [Empty("empty programs on the scheduler's points", [empty(tp) for tp in points]),
                    Empty("the same, attached raw", [empty(tp, "raw_tracepoint") for tp in points])]
    port = free_port()                      # nothing listens there: the other trees watch nothing
    try:
        results = alternate(Target(ServiceSpec("nothing", port=port), 0, port, measure), tracers, args.rounds,
                            args.bpf_stats)
    finally:
        for t in tracers:
            t.close()
    return report(f"perf bench sched pipe -l {PIPE_LOOPS}, both processes on CPU 0, {args.rounds} rounds; "
                  f"CPU µs/op is both processes'", results, 0, unit="op")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.server_overhead", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=int, default=5, help="length of one measured run (whole seconds: wrk's -d)")
    ap.add_argument("--handler", choices=("static", "sleep", "both"), default="static")
    ap.add_argument("--gateway", action="store_true", help="also the reference gateway")
    ap.add_argument("--no-nginx", dest="nginx", action="store_false", help="no nginx rounds")
    ap.add_argument("--redis", action="store_true", help="also a real redis-server under redis-benchmark")
    ap.add_argument("--sched-pipe", action="store_true",
                    help="also a context-switch-heavy process slotune does not watch (perf bench sched pipe)")
    ap.add_argument("--no-pin", dest="pin", action="store_false", help="leave nginx and wrk unpinned")
    ap.add_argument("--compare", type=Path, action="append", default=[], metavar="TREE",
                    help="also all families as the slotune checked out in TREE has them (e.g. a worktree "
                         "of an earlier commit), watching nginx (with --targets also watching nothing)")
    ap.add_argument("--empty", action="store_true",
                    help="also empty programs on slotune's attach points: what attaching there costs alone")
    ap.add_argument("--targets", action="store_true",
                    help="nginx only with the variants the targets name (watching nginx, watching nothing, "
                         "bpftrace) and the A/A run: for many short rounds")
    ap.add_argument("--bpf-stats", action="store_true",
                    help="kernel per-program run time (sysctl kernel.bpf_stats_enabled=1 while it runs)")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("run as root: loading BPF programs needs CAP_BPF+CAP_PERFMON")
    for tool in ("nginx", "wrk", "bpftrace", "bpftool", *(["perf"] if args.sched_pipe else [])):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is not installed (the project's setup installs it)")
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines = []
    with bpf_stats_on() if args.bpf_stats else contextlib.nullcontext():
        with tempfile.TemporaryDirectory(prefix="slotune-server-overhead-") as tmp:
            if args.nginx:
                lines += nginx_rounds(args, Path(tmp))
            if args.gateway:
                lines += gateway_rounds(args, Path(tmp))
            if args.redis:
                lines += redis_rounds(args, Path(tmp))
            if args.sched_pipe:
                lines += pipe_rounds(args, Path(tmp))
    print(f"server overhead, {started}, {os.cpu_count()} CPUs, load average at the end "
          f"{os.getloadavg()[0]:.1f}; each traced run against the mean of the untraced runs beside it, "
          f"medians over rounds [range]")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
