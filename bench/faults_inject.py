"""The faults the attribution matrix injects into a running reference stack,
one at a time, each with the cause attribution should name. Every fault is a
real one: CPU hogs, a shaped network queue, settings pushed through the
stack's control API, more load, a noisy neighbour, two at once. inject() and
remove() leave the stack as they found it."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

HOG = "while True: pass\n"


def patch(base_url: str, token_file: str, changes: dict) -> None:
    """PATCH <base>/admin/config with the bearer token; raises with the service's reason on a refusal."""
    token = Path(token_file).read_text().strip()
    req = urllib.request.Request(base_url + "/admin/config", data=json.dumps(changes).encode(), method="PATCH",
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as r:
        r.read()


@dataclass
class Fault:
    name: str
    what: str                          # how it is made, for the README
    expected: tuple[tuple[str, str], ...]   # (service, cause) pairs that count as naming it
    stack: dict = field(default_factory=dict)

    def prepare(self) -> None:
        """Whatever takes time before the fault can start at once (called before inject)."""

    def inject(self) -> None:
        pass

    def remove(self) -> None:
        pass

    def correct(self, service: str, cause: str) -> bool:
        return any(s in (service, "*") and c in (cause, "*") for s, c in self.expected)


@dataclass
class SettingFault(Fault):
    """Push fault settings to one service, restore the old values after."""
    target: str = ""
    fault: dict = field(default_factory=dict)
    normal: dict = field(default_factory=dict)

    def inject(self) -> None:
        patch(self.stack["urls"][self.target], self.stack["token_file"], self.fault)

    def remove(self) -> None:
        patch(self.stack["urls"][self.target], self.stack["token_file"], self.normal)


def _tids(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


def _autogroup_nice(pid: int, nice: int) -> int | None:
    """Set the nice of a process's scheduler autogroup (its session); returns the old one,
    None where the kernel has no autogroups. With autogroups on, CPU time is shared
    between sessions first, so a task's own nice only counts inside its session."""
    path = Path(f"/proc/{pid}/autogroup")
    try:
        old = int(path.read_text().split("nice")[-1])
        path.write_text(str(nice))
        return old
    except (OSError, ValueError):
        return None


@dataclass
class CpuContention(Fault):
    """Pin the inference server to one CPU at nice 9 (its threads and its autogroup)
    beside a busy loop at nice 0 in a session of its own: it then gets about 12 % of
    that CPU (weights 137 vs 1024), a little more than it needs, and waits for the
    loop's slices. The rest of the machine keeps the other CPU, so the daemon and
    the load go on."""
    target: str = "inference"
    cpu: int = 1
    nice: int = 9
    procs: list = field(default_factory=list)
    saved: dict = field(default_factory=dict)
    autogroup_nice: int | None = None

    def inject(self) -> None:
        pid = self.stack["pids"][self.target]
        self.autogroup_nice = _autogroup_nice(pid, self.nice)
        for tid in _tids(pid):
            try:
                self.saved[tid] = (os.sched_getaffinity(tid), os.getpriority(os.PRIO_PROCESS, tid))
                os.sched_setaffinity(tid, {self.cpu})
                os.setpriority(os.PRIO_PROCESS, tid, self.nice)
            except OSError:
                pass
        self.procs = [subprocess.Popen(["taskset", "-c", str(self.cpu), sys.executable, "-c", HOG],
                                       start_new_session=True)]

    def remove(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait()
        self.procs = []
        if self.autogroup_nice is not None:
            _autogroup_nice(self.stack["pids"][self.target], self.autogroup_nice)
        for tid, (cpus, nice) in self.saved.items():
            try:
                os.sched_setaffinity(tid, cpus)
                os.setpriority(os.PRIO_PROCESS, tid, nice)
            except OSError:
                pass
        self.saved = {}


@dataclass
class SlowTool(SettingFault):
    """A tool's heavy tail, with the gateway's tool-result caches flushed every second
    so that queries reach the tools (warm caches answer nearly all of them)."""
    stop: threading.Event = field(default_factory=threading.Event)
    flusher: threading.Thread | None = None

    def inject(self) -> None:
        super().inject()
        self.stop.clear()
        self.flusher = threading.Thread(target=self._flush, daemon=True)
        self.flusher.start()

    def _flush(self) -> None:
        token = Path(self.stack["token_file"]).read_text().strip()
        while not self.stop.wait(1.0):
            req = urllib.request.Request(self.stack["urls"]["gateway"] + "/admin/cache/flush", method="POST",
                                         data=b'{"level": "all"}', headers={"Authorization": f"Bearer {token}"})
            try:
                urllib.request.urlopen(req, timeout=2).read()
            except OSError:
                pass

    def remove(self) -> None:
        self.stop.set()
        if self.flusher is not None:
            self.flusher.join(timeout=5)
        super().remove()


def tc(*args: str) -> None:
    subprocess.run(["tc", *args], check=True, capture_output=True, text=True)


@dataclass
class NetworkQueue(Fault):
    """A 4 Mbit TBF queue (100 KB: up to 200 ms) on the loopback path to one port, shared with
    a bulk TCP flow to a sink, so requests wait behind the bulk data. It must run
    in the bench's own network namespace: it reshapes that namespace's `lo`."""
    port: int = 0
    rate: str = "4mbit"
    limit: str = "100kb"
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list = field(default_factory=list)

    def inject(self) -> None:
        sink = socket.socket()
        sink.bind(("127.0.0.1", 0))
        sink.listen(1)
        sink_port = sink.getsockname()[1]
        # HTB only sorts (both classes far faster than the link); the TBF under 1:10 is the queue.
        # (This kernel has no prio qdisc.)
        tc("qdisc", "add", "dev", "lo", "root", "handle", "1:", "htb", "default", "20", "r2q", "100000")
        for cls in ("1:10", "1:20"):
            tc("class", "add", "dev", "lo", "parent", "1:", "classid", cls, "htb", "rate", "10gbit")
        tc("qdisc", "add", "dev", "lo", "parent", "1:10", "handle", "10:", "tbf", "rate", self.rate,
           "burst", "16kb", "limit", self.limit)
        for port in (self.port, sink_port):
            tc("filter", "add", "dev", "lo", "parent", "1:", "protocol", "ip", "prio", "1", "u32",
               "match", "ip", "dport", str(port), "0xffff", "flowid", "1:10")
        self.stop.clear()
        self.threads = [threading.Thread(target=self._drain, args=(sink,), daemon=True),
                        threading.Thread(target=self._send, args=(sink_port,), daemon=True)]
        for t in self.threads:
            t.start()

    def _drain(self, sink: socket.socket) -> None:
        conn, _ = sink.accept()
        sink.close()
        with conn:
            while not self.stop.is_set() and conn.recv(1 << 16):
                pass

    def _send(self, port: int) -> None:
        chunk = b"\0" * (1 << 16)
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.settimeout(0.5)
            while not self.stop.is_set():
                try:
                    s.sendall(chunk)
                except socket.timeout:
                    continue
                except OSError:
                    return

    def remove(self) -> None:
        self.stop.set()
        subprocess.run(["tc", "qdisc", "del", "dev", "lo", "root"], capture_output=True)
        for t in self.threads:
            t.join(timeout=3)
        self.threads = []


ROOT = Path(__file__).resolve().parents[1]
SURGE = 8.0          # a surge adds this many times the usual load to the stack (its batcher absorbs 4x)
APP_SURGE = 3.0      # ... and to the app: 4x its 25/s is a little past its one worker's ~90/s, so the tail
                     # grows all through the fault and the backlog left drains in seconds (at 8x it took
                     # half a minute, into the next fault)
SURGE_S = 120.0      # the surge's schedule (longer than a fault stays on): its queries are drawn before the
                     # first is sent, which for an hour's schedule took longer than the fault lasted


@dataclass
class Surge(Fault):
    """More queries than usual: a second open-loop load generator (reference_stack's own)
    sending `rate` more queries a second to `url` while the fault is on, each with
    `context_bytes` of context as the usual load's."""
    url: str = ""
    rate: float = 0.0
    context_bytes: int = 0
    proc: subprocess.Popen | None = None

    def prepare(self) -> None:
        # The generator's imports take seconds on a busy host: done before the fault starts.
        code = ("import sys\nfrom reference_stack.loadgen import run_load\nprint('ready', flush=True)\n"
                f"sys.stdin.readline()\nrun_load({self.url!r}, {self.rate!r}, {SURGE_S!r}, "
                f"context_bytes={self.context_bytes!r})\n")
        self.proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError("the surge's load generator did not start")

    def inject(self) -> None:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def remove(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


@dataclass
class NoisyNeighbour(Fault):
    """An unrelated CPU-heavy job on the same cores: PER_CPU busy loops per CPU at nice 0,
    each in a session of its own, not a service and not pinned (a parallel build, a
    batch job, another tenant's workers)."""
    PER_CPU = 2
    procs: list = field(default_factory=list)

    def inject(self) -> None:
        self.procs = [subprocess.Popen([sys.executable, "-c", HOG], start_new_session=True)
                      for _ in range(self.PER_CPU * (os.cpu_count() or 1))]

    def remove(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait()
        self.procs = []


@dataclass
class Together(Fault):
    """Several faults at once: the verdict must name every one, in the order of the
    growth each made alone (`parts` is put in that order by the matrix, from the runs
    of each part alone before it)."""
    parts: tuple[Fault, ...] = ()
    in_order: bool = True       # the verdict must name the parts in their order (the matrix sets it)

    def prepare(self) -> None:
        for f in self.parts:
            f.prepare()

    def inject(self) -> None:
        for f in self.parts:
            f.inject()

    def remove(self) -> None:
        for f in reversed(self.parts):
            f.remove()

    def correct(self, service: str, cause: str) -> bool:
        return self.parts[0].correct(service, cause)


def matrix_faults(stack: dict, sidecar_port: int, rate: float) -> list[Fault]:
    """The faults of the matrix, clean first, for a stack started with llm_via_sidecar on
    and loaded with `rate` queries a second."""
    faults = _stack_faults(stack, sidecar_port)
    by_name = {f.name: f for f in faults}
    return [*faults,
            Surge("surge", f"a second load generator: {SURGE * rate:g} more queries a second "
                           f"({SURGE + 1:g}x the load)",
                  (("*", "offered_load"),), stack, url=stack["query_url"], rate=SURGE * rate),
            NoisyNeighbour("neighbour", f"{NoisyNeighbour.PER_CPU} busy loops per CPU at nice 0, unrelated to any service",
                           (("*", "runqueue_wait"),), stack),
            Together("cpu+tool", "the cpu and the tool faults at once, named in the order of the growth "
                                 "each made alone",
                     by_name["cpu"].expected, stack, parts=(by_name["cpu"], by_name["tool"]))]


def _stack_faults(stack: dict, sidecar_port: int) -> list[Fault]:
    return [
        Fault("clean", "no fault", (("", ""),), stack),
        CpuContention("cpu", "inference pinned to CPU 1 at nice 9 (threads and autogroup) beside a busy loop at nice 0",
                      (("inference", "runqueue_wait"),), stack),
        NetworkQueue("network", "gateway -> sidecar traffic through a 4 Mbit TBF (100 KB) shared with a bulk "
                                "TCP flow, on lo of the bench's own network namespace",
                     (("gateway", "network_rtt"), ("gateway", "retransmits")), stack, port=sidecar_port),
        SettingFault("tls", "sidecar reuse_connections=false: a TCP + TLS handshake per request",
                     (("gateway", "tls_handshake"), ("gateway", "connect"),
                      ("sidecar", "tls_handshake"), ("sidecar", "connect")), stack,
                     target="sidecar", fault={"reuse_connections": False}, normal={"reuse_connections": True}),
        SlowTool("tool", "search tool: half of its calls wait 400 ms more (gateway caches flushed each second)",
                     (("gateway", "downstream:search"), ("search", "*"), ("gateway", "tool:search")), stack,
                     target="search", fault={"tail_prob": 0.5, "tail_ms": 400.0}, normal={"tail_prob": 0.0}),
        SettingFault("queue", "inference max_queue_delay_ms 5 -> 150",
                     (("inference", "batch_queue_wait"),), stack,
                     target="inference", fault={"max_queue_delay_ms": 150.0}, normal={"max_queue_delay_ms": 5.0}),
        SettingFault("blocking", "gateway blocking_io_ms=25: write+fsync+sleep on the event loop per request",
                     (("gateway", "blocking_syscalls"),), stack,
                     target="gateway", fault={"blocking_io_ms": 25.0}, normal={"blocking_io_ms": 0.0}),
    ]


@dataclass
class AppSleep(Fault):
    """bench/thirdparty_app.py's event loop blocked in a sleep syscall for `ms` per request."""
    url: str = ""
    ms: float = 0.0

    def _set(self, ms: float) -> None:
        req = urllib.request.Request(self.url + "/fault", data=json.dumps({"sleep_ms": ms}).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(req, timeout=5) as r:
            r.read()

    def inject(self) -> None:
        self._set(self.ms)

    def remove(self) -> None:
        self._set(0.0)


@dataclass
class RedisPause(Fault):
    """A Redis that stalls in bursts: `CLIENT PAUSE ms ALL` (every client's commands wait,
    then run) every `every_s` seconds, sent from a connection of its own."""
    port: int = 0
    ms: int = 0
    every_s: float = 0.0
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def _pause(self) -> None:
        import redis
        r = redis.Redis(port=self.port)
        while not self.stop.wait(self.every_s):
            r.execute_command("CLIENT", "PAUSE", self.ms, "ALL")
        r.execute_command("CLIENT", "UNPAUSE")
        r.close()

    def inject(self) -> None:
        self.stop.clear()
        self.thread = threading.Thread(target=self._pause, daemon=True)
        self.thread.start()

    def remove(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(timeout=5)


def app_faults(url: str, port: int, rate: float, context_bytes: int, redis_port: int) -> list[Fault]:
    """The faults for a third-party app watched by eBPF only (bench/thirdparty_app.py on uvicorn,
    reading the Redis at redis_port, watched as `cache`), loaded with `rate` requests a second
    that carry `context_bytes` of context each."""
    return [
        Fault("clean", "no fault", (("", ""),)),
        NoisyNeighbour("neighbour", f"{NoisyNeighbour.PER_CPU} busy loops per CPU at nice 0, unrelated to the app",
                       (("app", "runqueue_wait"),)),
        Surge("surge", f"a second load generator: {APP_SURGE * rate:g} more requests a second "
                       f"({APP_SURGE + 1:g}x the load: past the app's capacity)",
              (("app", "offered_load"),), url=url + "/query", rate=APP_SURGE * rate, context_bytes=context_bytes),
        AppSleep("blocking", "a 10 ms sleep syscall on the event loop per request", (("app", "blocking_syscalls"),),
                 url=url, ms=10.0),
        # before the network fault, whose shaped queue drains into the next fault's baseline
        RedisPause("redis", "the app's Redis paused 40 ms (CLIENT PAUSE ALL) every 0.2 s",
                   (("app", "downstream:cache"), ("cache", "*")), port=redis_port, ms=40, every_s=0.2),
        NetworkQueue("network", "the app's traffic through a 4 Mbit TBF (100 KB) shared with a bulk TCP flow",
                     (("app", "network_rtt"), ("app", "retransmits")), port=port),
    ]
