"""What the kernel probes cost: ns added per syscall by each probe family and by
all of them together, against no probe and against empty tracepoint programs,
for a getppid() loop and a UDP sendto() loopback loop (a small C helper timing
its own thread's CPU time, so the loop is a few instructions and preemption by
other work on the machine does not count). Variants alternate round by round and the
figures are medians. Also the RSS of a process holding all probes, after load
and after many collection intervals.

    python -m bench.probe_overhead [--rounds 7] [--calls 200000] [--soak SECONDS]"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from slotune.collectors.kernel import FAMILIES, KernelCollector
from slotune.collectors.kernel.arrivals import EXEC
from slotune.collectors.kernel.family import Attachment
from slotune.collectors.kernel.program import (HINT_SLOTS, TARGETING_TRACEPOINTS, Program, attach_tracepoint,
                                              detach_tracepoint)
from slotune.model.service import ServiceSpec

LOOP_C = r"""
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
/* CPU time of this thread: BPF programs run in it, time spent preempted by the
   machine's other work does not count. */
static double now(void) { struct timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); return t.tv_sec * 1e9 + t.tv_nsec; }
int main(int argc, char **argv) {
    long n = atol(argv[2]);
    double t0, t1;
    char go;
    if (read(0, &go, 1) != 1) return 1;   /* start when told: lets a watcher register us first */
    if (strcmp(argv[1], "getppid") == 0) {
        t0 = now();
        for (long i = 0; i < n; i++) syscall(SYS_getppid);
        t1 = now();
    } else {
        int rx = socket(AF_INET, SOCK_DGRAM, 0), tx = socket(AF_INET, SOCK_DGRAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t len = sizeof a;
        bind(rx, (struct sockaddr *)&a, sizeof a);
        getsockname(rx, (struct sockaddr *)&a, &len);
        char buf[64] = {0}, sink[64];
        t0 = now();
        for (long i = 0; i < n; i++) {
            sendto(tx, buf, sizeof buf, 0, (struct sockaddr *)&a, sizeof a);
            if ((i & 63) == 63) while (recv(rx, sink, sizeof sink, MSG_DONTWAIT) > 0) {}
        }
        t1 = now();
    }
    printf("%.2f\n", (t1 - t0) / n);
    return 0;
}
"""

# One empty program per program type (BCC loads a function once, as one type).
EMPTY = "int empty(void *ctx) { return 0; }\nint empty_raw(void *ctx) { return 0; }"


def build_loop(folder: Path) -> Path:
    src, exe = folder / "syscall_loop.c", folder / "syscall_loop"
    src.write_text(LOOP_C)
    subprocess.run(["gcc", "-O2", "-o", str(exe), str(src)], check=True)
    return exe


class EmptyPrograms:
    """Empty programs on these attach points, raw where the point is raw: what
    attaching there costs before any program does any work."""

    def __init__(self, points: list[Attachment]):
        from bcc import BPF
        self.points, self.bpf = points, BPF(text=EMPTY.encode())

    def attach(self):
        for a in self.points:
            attach_tracepoint(self.bpf, a)

    def detach(self):
        for a in self.points:
            detach_tracepoint(self.bpf, a)


class Variant:
    """A set of programs that can be attached and detached between rounds."""

    def __init__(self, name: str, families: list[str] | None = None, empty_on: list[Attachment] | None = None,
                 watch_loop: bool = False):
        self.name, self.watch_loop = name, watch_loop
        self.program = self.empty = None
        if empty_on is not None:
            self.empty = EmptyPrograms(empty_on)
            self.bpf = self.empty.bpf
        elif families is not None:
            self.program = Program([FAMILIES[f]() for f in families])
            self.bpf = self.program.bpf
        else:
            self.bpf = None

    def attach(self):
        if self.program:
            self.program.attach_tracepoints()
        if self.empty:
            self.empty.attach()

    def detach(self):
        if self.program:
            self.program.detach_all()
        if self.empty:
            self.empty.detach()


def empty(tracepoint: str, kind: str = "tracepoint") -> Attachment:
    return Attachment(kind, tracepoint, "empty_raw" if kind == "raw_tracepoint" else "empty")


def all_attach_points() -> list[Attachment]:
    """Every point the families attach to, each once, as an empty program would."""
    points = [empty(tp) for tp, _ in TARGETING_TRACEPOINTS] + [empty(EXEC[0], "raw_tracepoint")]
    for f in FAMILIES.values():
        points += [empty(tp) for tp, _ in f.tracepoints] + [empty(tp, "raw_tracepoint") for tp, _ in f.raw_tracepoints]
    return list(dict.fromkeys(points))


def noise_ns(rounds: list[float]) -> float:
    """How far apart two runs of the same variant land: the range of its rounds.
    A difference within it is not a measurement."""
    return max(rounds) - min(rounds)


def added_cell(added: float, noise: float) -> str:
    return f"{added:>+8.0f}" if abs(added) > noise else f"{'~0':>8}"


def ratio_line(syscall: str, added: dict, noise: float) -> str:
    """How the families' added cost compares with empty programs', or why it cannot be said
    (either figure within twice the spread of the no-probe runs)."""
    parts = []
    for label, ref in (("empty programs on the same attach points", "empty, same attach points as all"),
                       ("one empty sys_enter program", "empty, 1 tracepoint (sys_enter)")):
        mine, theirs = added[("all families", syscall)], added[(ref, syscall)]
        if theirs <= 2 * noise or abs(mine) <= 2 * noise:   # a ratio of two figures near the noise is noise
            parts.append(f"vs {label}: within noise (all families {mine:+.0f} ns, "
                         f"{label} {theirs:+.0f} ns, runs of one variant spread {noise:.0f} ns)")
        else:
            parts.append(f"{mine / theirs:.2f}x what {label} add")
    return f"{syscall}: all families " + "; ".join(parts)


def run_loop(loop: Path, syscall: str, calls: int, variant: Variant) -> float:
    """ns per call of one loop run; with watch_loop the loop is a watched service's task."""
    proc = subprocess.Popen([str(loop), syscall, str(calls)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    if variant.watch_loop:
        import ctypes
        variant.bpf["watched"][ctypes.c_uint32(proc.pid)] = ctypes.c_uint32(1)
        variant.bpf["watched_hint"][ctypes.c_int(proc.pid % HINT_SLOTS)] = ctypes.c_uint32(1)
    out, _ = proc.communicate("g")
    if proc.returncode:
        raise RuntimeError(f"{loop} {syscall} failed with status {proc.returncode}")
    return float(out)


def measure(loop: Path, variants: list[Variant], rounds: int, calls: int):
    """{(variant, syscall): [ns per call, one per round]}: variants alternate within
    each round, and each figure is the best of 3 runs (the least disturbed by the
    machine's other work)."""
    results: dict[tuple[str, str], list[float]] = {}
    for _ in range(rounds):
        for v in variants:
            v.attach()
            try:
                for syscall, n in (("getppid", calls), ("sendto", calls // 10)):
                    best = min(run_loop(loop, syscall, n, v) for _ in range(3))
                    results.setdefault((v.name, syscall), []).append(best)
            finally:
                v.detach()
    return results


def rss_mib(pid: int | str = "self") -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def rss_figures(intervals: int, interval_s: float) -> str:
    """RSS of this process with every family loaded, watching an HTTP server that a
    client thread keeps busy (new connections, requests, syscalls, wake-ups)."""
    import bcc  # noqa: F401  (counted in "before": every daemon imports it)
    import threading
    import urllib.request
    before = rss_mib()
    server = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "0"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                              cwd=tempfile.gettempdir())
    port = int(server.stdout.readline().split(" port ")[1].split()[0])
    stop = threading.Event()

    def client():
        while not stop.wait(0.01):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5).read()

    collector = KernelCollector()
    worker = threading.Thread(target=client, daemon=True)
    try:
        collector.start([ServiceSpec("bench-http", cmdline=r"-m http\.server --bind 127\.0\.0\.1 0")])
        loaded = rss_mib()
        worker.start()
        samples, requests = [], 0
        for i in range(intervals):
            time.sleep(interval_s)
            for s in collector.collect(float(i), float(i + 1)):
                h = s.histograms.get(("http_request", ""))
                requests += h.count if h else 0
            samples.append(rss_mib())
        third = max(1, len(samples) // 3)
        return (f"RSS: {before:.0f} MiB with bcc imported, {loaded:.0f} MiB with all probes loaded, "
                f"{statistics.median(samples[:third]):.0f} MiB -> {statistics.median(samples[-third:]):.0f} MiB "
                f"(median of first vs last third of {intervals} intervals of {interval_s:g} s, "
                f"{requests} requests seen by the probes meanwhile)")
    finally:
        stop.set()
        worker.join(timeout=10)
        collector.close()
        server.kill()
        server.wait()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.probe_overhead", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=200_000, help="getppid calls per loop run (sendto: a tenth)")
    parser.add_argument("--soak", type=float, default=30, help="seconds of 1 s intervals for the RSS figure")
    parser.add_argument("--rss-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("run as root: loading BPF programs needs CAP_BPF+CAP_PERFMON")
    if args.rss_only:
        print(rss_figures(int(args.soak), 1.0))
        return 0
    others = [line for line in subprocess.run(["bpftool", "prog", "list"], capture_output=True,
                                              text=True).stdout.splitlines() if " tracepoint " in line]

    with tempfile.TemporaryDirectory() as tmp:
        loop = build_loop(Path(tmp))
        variants = [Variant("no probe"),
                    Variant("empty, 1 tracepoint (sys_enter)", empty_on=[empty("raw_syscalls:sys_enter")]),
                    Variant("empty, same attach points as all", empty_on=all_attach_points())]
        variants += [Variant(name, [name]) for name in FAMILIES]
        variants.append(Variant("all families", list(FAMILIES)))
        variants.append(Variant("all families, loop is watched", list(FAMILIES), watch_loop=True))
        started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        results = measure(loop, variants, args.rounds, args.calls)

    print(f"probe overhead, {started}, {args.rounds} alternating rounds x best of 3 runs x {args.calls} getppid / "
          f"{args.calls // 10} sendto calls, thread CPU time, "
          f"medians; {len(others)} other tracepoint programs were attached on this host at the start")
    base = {s: statistics.median(results[("no probe", s)]) for s in ("getppid", "sendto")}
    noise = {s: noise_ns(results[("no probe", s)]) for s in ("getppid", "sendto")}
    print(f"{'variant':<36} {'getppid ns':>11} {'added':>8} {'sendto ns':>10} {'added':>8}")
    added = {}
    for v in variants:
        row = f"{v.name:<36}"
        for s in ("getppid", "sendto"):
            med = statistics.median(results[(v.name, s)])
            added[(v.name, s)] = med - base[s]
            row += f" {med:>11.0f} {added_cell(med - base[s], noise[s])}"
        print(row)
    print(f"~0: within the spread of the no-probe runs (getppid {noise['getppid']:.0f} ns, "
          f"sendto {noise['sendto']:.0f} ns)")
    for s in ("getppid", "sendto"):
        print(ratio_line(s, added, noise[s]))
    sys.stdout.flush()
    subprocess.run([sys.executable, "-m", "bench.probe_overhead", "--rss-only", "--soak", str(args.soak)], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
