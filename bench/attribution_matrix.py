"""Attribution on a fault-injection matrix: runs the reference stack and the
slotune daemon (real collectors: service /metrics and eBPF probes) in a
private network namespace, injects one known fault at a time (bench/faults_inject.py)
under steady load, and prints the confusion matrix (injected fault x the root
cause the gateway's attribution names), the injected cause's mean share and
the time to detection.

    python bench/attribution_matrix.py                 # 2 runs of each fault, about 9 minutes
    python bench/attribution_matrix.py --runs 5 --faults cpu,queue,surge --json /tmp/matrix.json
    python bench/attribution_matrix.py --target uvicorn --runs 5   # a FastAPI app and its Redis, eBPF only

Needs root (eBPF, tc, a network namespace)."""
from __future__ import annotations

import argparse
import collections
import itertools
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.faults_inject import app_faults, matrix_faults  # noqa: E402

NETNS_FLAG = "SLOTUNE_BENCH_OWN_NETNS"
TOOLS = ("search", "calculator", "weather")
# Tools answer in a few ms, so the gateway's own tail is the LLM path's and a fault
# there is not lost in tool noise (the default search tool's 40 ms lognormal is).
QUIET_TOOLS = {t: {"latency_ms": ms, "latency_sigma": 0.2} for t, ms in (("search", 8.0), ("calculator", 2.0),
                                                                          ("weather", 5.0))}
# The app's queries carry a RAG prompt's context, as LLM requests do: a slow link then
# shows in the server's own timing (the request's first read to its last write).
APP_CONTEXT_BYTES = 16384
SMALL_MODEL = ["--device", "cpu", "--d-model", "64", "--layers", "2", "--heads", "4", "--max-new-tokens", "4"]


def enter_own_netns() -> None:
    """Re-run this script in a fresh network namespace (its lo is ours to reshape), lo up at MTU 1500
    so a TBF burst can hold a whole packet."""
    if os.environ.get(NETNS_FLAG) != "1":
        env = dict(os.environ, **{NETNS_FLAG: "1"})
        os.execvpe("unshare", ["unshare", "--net", sys.executable, *sys.argv], env)
    subprocess.run(["ip", "link", "set", "lo", "up", "mtu", "1500"], check=True)


def daemon_table(exporter_port: int, work: Path) -> str:
    """The daemon's own config: 1 s windows, its files under work, dry-run (the matrix only reads)."""
    return (f'[daemon]\ncollect_interval_s = 1.0\nexporter_address = "127.0.0.1:{exporter_port}"\n'
            f'baseline_store = "{work}/baselines.sqlite"\naudit_log = "{work}/audit.jsonl"\ndry_run = true\n\n')


def write_config(path: Path, stack: dict, ports: dict, exporter_port: int, work: Path) -> None:
    run_dir = stack["run_dir"]
    urls = stack["urls"]

    def service(name: str, match: str, metric: str, downstream=(), peers=None, metrics_url=None) -> str:
        lines = [f"[services.{name}]",
                 f'cmdline = "reference_stack {match} .*--run-dir {run_dir}( |$)"',
                 f'metrics_url = "{metrics_url or urls[name] + "/metrics"}"',
                 f'latency_metric = "{metric}"', "slo_p99_ms = 1000.0",
                 f"downstream = {json.dumps(list(downstream))}"]
        if peers:
            lines.append("peers = { " + ", ".join(f'"{p}" = "{n}"' for p, n in peers.items()) + " }")
        return "\n".join(lines) + "\n"

    text = daemon_table(exporter_port, work)
    text += service("gateway", "gateway", "gateway_request_duration_seconds", ("sidecar", *TOOLS),
                    {ports["sidecar"]: "sidecar", **{ports[t]: t for t in TOOLS}})
    text += service("sidecar", "sidecar", "sidecar_request_duration_seconds", ("inference",),
                    {ports["inference"]: "inference"})
    text += service("inference", "inference", "inference_request_duration_seconds")
    for t in TOOLS:
        text += service(t, f"tool --name {t}", "tool_request_duration_seconds")
    path.write_text(text)


class DaemonLoop:
    """The slotune daemon (its real Daemon class and collectors) stepped once a second in a thread;
    each step's attribution of every service is kept as (window end, {service: Explanation})."""

    def __init__(self, cfg):
        from slotune.collectors.kernel.collector import KernelCollector
        from slotune.collectors.service_metrics import ServiceMetricsCollector
        from slotune.process import Daemon
        self.daemon = Daemon(cfg, dry_run=True, collectors=[ServiceMetricsCollector(), KernelCollector()])
        self.steps: list[tuple[float, dict]] = []
        self.step_cost: list[float] = []
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="daemon", daemon=True)

    def start(self) -> None:
        self.daemon.start()
        self.thread.start()

    def _run(self) -> None:
        # The daemon thread at nice -5, as a host agent is usually run: on 2 shared CPUs the
        # CPU fault would otherwise stall the measurement itself.
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), -5)
        start = time.time()
        while not self.stop.wait(max(0.0, start + 1.0 - time.time())):
            end = time.time()
            t = time.perf_counter()
            try:
                self.daemon.step(start, end)
            except Exception as exc:      # counted and reported: the loop (and the matrix) goes on
                self.errors.append(f"{type(exc).__name__}: {exc}")
            self.step_cost.append(time.perf_counter() - t)
            self.steps.append((end, dict(self.daemon.metrics.attribution)))
            start = end

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=10)
        self.daemon.close()


def share_of(explanations: dict, service: str, cause: str) -> float:
    """The cause's share of the service's growth; service "*": of whichever service it is largest in."""
    if service == "*":
        return max((share_of(explanations, s, cause) for s in explanations), default=0.0)
    if service not in explanations:
        return 0.0
    shares = explanations[service].shares
    if cause == "*":
        return max(shares.values(), default=0.0)
    return shares.get(cause, 0.0)


ORDER_RATIO = 1.5   # parts whose growths alone are nearer than this may be named in either order


def in_order_of_growth(parts, results: list[dict]) -> tuple[tuple, bool]:
    """Faults in the order of the growth each made alone in the runs so far, largest first
    (a part not run alone keeps its place), and whether that order is asked of the
    verdict: only where each part alone grew the tail ORDER_RATIO times the next one's
    (nearer, their shares in a run together are a toss-up)."""
    def alone(f) -> float:
        grown = [r["growth_s"] for r in results if r["fault"] == f.name]
        return sum(grown) / len(grown) if grown else 0.0
    ordered = tuple(sorted(parts, key=alone, reverse=True))
    growths = [alone(f) for f in ordered]
    return ordered, all(a >= ORDER_RATIO * b for a, b in zip(growths, growths[1:]))


def names_every_part(fault, exp) -> bool:
    """Faults injected together: the explanation's dominant paths (top first, then the
    others by share) end at each part's cause, in the parts' order where it is asked."""
    roots = [path[-1][:2] for path in (exp.path, *exp.also) if path]
    orders = [fault.parts] if fault.in_order else itertools.permutations(fault.parts)
    return len(roots) >= len(fault.parts) and any(all(p.correct(*r) for p, r in zip(order, roots))
                                                   for order in orders)


def judge(fault, steps: list[tuple[float, dict]], t_on: float, settle: int, service: str = "gateway") -> dict:
    """One run: the windows while the fault was on, read as the user-facing service's attribution."""
    every = [ex for end, ex in steps if end > t_on and service in ex]     # each window: service -> Explanation
    on = [(end, ex[service]) for end, ex in steps if end > t_on and service in ex]
    if not on:
        raise RuntimeError(f"{fault.name}: the daemon recorded no window while the fault was on")
    roots = [exp.root_cause for _, exp in on]
    together = bool(getattr(fault, "parts", ()))
    correct = [names_every_part(fault, exp) if together else fault.correct(svc, cause)
               for (_, exp), (svc, cause, _) in zip(on, roots)]
    tail = [exp.growth_s > exp.noise_s for _, exp in on]
    # Every (service, cause) the fault counts as named under votes as its first one: a TLS handshake
    # named at the gateway in one window and at the sidecar in the next is one answer. Faults
    # injected together are named when every part is, in order.
    canonical = ("+".join(":".join(p.expected[0]) for p in fault.parts) if together
                 else ":".join(fault.expected[0]) if fault.expected[0][0] else "none")

    def label(exp, ok: bool) -> str:
        svc, cause, _ = exp.root_cause
        return canonical if ok else "none" if not svc else f"{svc}:{cause}"
    reported = collections.Counter(label(exp, ok) for (_, exp), ok in
                                   list(zip(on, correct))[settle:] or zip(on, correct)).most_common(1)[0][0]
    leaf = [max((share_of(ex, s, c) for s, c in fault.expected), default=0.0) for ex in every[settle:]]
    e2e = [share if ok else 0.0 for (_, _, share), ok in zip(roots[settle:], correct[settle:])]
    top_shares = [max(exp.shares.values(), default=0.0) for _, exp in on]
    first_tail = tail.index(True) if True in tail else None
    first_ok = correct.index(True) if True in correct else None
    named = reported == canonical if together else fault.correct(*(reported.split(":", 1) if reported != "none"
                                                                    else ("", "")))
    return {"fault": fault.name, "reported": reported, "correct": named,
            "leaf_share": sum(leaf) / len(leaf) if leaf else 0.0, "e2e_share": sum(e2e) / len(e2e) if e2e else 0.0,
            "max_top_share": max(top_shares, default=0.0), "windows": len(on),
            "growth_s": sum(exp.growth_s for _, exp in on[settle:]) / max(len(on[settle:]), 1),
            "tail_at": first_tail, "detected_at": first_ok,
            "verdicts": [_detail(exp) for _, exp in on]}


def _detail(exp) -> str:
    """A window's verdict with the figures behind it (for --verbose)."""
    rises = sorted(((e.rise_s, c) for c, e in exp.evidence.items() if e.rise_s > 0), reverse=True)[:3]
    return (f"{exp.verdict}  [P50 {exp.p50_s * 1e3:.1f} P99 {exp.p99_s * 1e3:.1f} growth {exp.growth_s * 1e3:+.1f} "
            f"noise {exp.noise_s * 1e3:.1f} ms; rises " + ", ".join(f"{c} {r * 1e3:.2f}" for r, c in rises) + "]")


def report(results: list[dict], faults, service: str = "gateway") -> str:
    lines = [f"what each run named (the root cause of the {service}'s attribution most frequent over the "
             "fault's steady windows), runs per answer", ""]
    for f in faults:
        counts = collections.Counter(r["reported"] for r in results if r["fault"] == f.name)
        if counts:
            lines.append(f"{f.name:<10}" + ", ".join(f"{label} {n}" for label, n in counts.most_common()))
    lines += ["", f"{'fault':<10}{'runs':>5}{'correct':>9}{'leaf share':>12}{'e2e share':>11}"
                  f"{'detect (windows after tail)':>29}{'max top share':>15}"]
    for f in faults:
        rows = [r for r in results if r["fault"] == f.name]
        if not rows:
            continue
        ok = sum(r["correct"] for r in rows)
        delays = [r["detected_at"] - (r["tail_at"] or 0) + 1 for r in rows
                  if r["detected_at"] is not None and f.name != "clean"]
        delay = "-" if not delays else f"{min(delays)}..{max(delays)}"
        leaf = "-" if f.name == "clean" else f"{sum(r['leaf_share'] for r in rows) / len(rows):.0%}"
        e2e = "-" if f.name == "clean" else f"{sum(r['e2e_share'] for r in rows) / len(rows):.0%}"
        lines.append(f"{f.name:<10}{len(rows):>5}{ok:>5}/{len(rows):<3}{leaf:>12}{e2e:>11}{delay:>29}"
                     f"{max(r['max_top_share'] for r in rows):>15.0%}")
    faulty = [r for r in results if r["fault"] != "clean"]
    if faulty:
        lines.append(f"\ntop cause correct in {sum(r['correct'] for r in faulty)}/{len(faulty)} fault runs; "
                     f"injected cause's mean share {sum(r['leaf_share'] for r in faulty) / len(faulty):.0%} "
                     f"where it lives, {sum(r['e2e_share'] for r in faulty) / len(faulty):.0%} of the {service}'s growth")
    return "\n".join(lines)


@dataclass
class Target:
    """What the matrix runs against: the service whose attribution is judged, where the
    load goes, the faults, the daemon's config, and how to stop it all."""
    service: str
    query_url: str
    faults: list
    config: Path
    stop: Callable[[], None]
    context_bytes: int = 0      # context sent with each query (reference_stack load --context-bytes)


def reference_stack(args, work: Path) -> Target:
    """The reference stack, judged at its gateway (services with metrics and eBPF)."""
    from reference_stack import launcher
    ports = dict(zip(("gateway", "inference", "sidecar", "sidecar_admin", "redis", "exporter", *TOOLS),
                     launcher.free_ports(6 + len(TOOLS))))
    stack_cfg = launcher.StackConfig(
        run_dir=work / "stack", gateway_port=ports["gateway"], inference_port=ports["inference"],
        sidecar_port=ports["sidecar"], sidecar_admin_port=ports["sidecar_admin"], redis_port=ports["redis"],
        tool_ports={t: ports[t] for t in TOOLS}, inference_args=SMALL_MODEL,
        settings={"gateway": {"llm_via_sidecar": True}, **QUIET_TOOLS}, startup_timeout_s=180.0)
    stack = launcher.start(stack_cfg)
    write_config(work / "slotune.toml", stack, ports, ports["exporter"], work)
    return Target("gateway", stack["query_url"], matrix_faults(stack, ports["sidecar"], args.rate),
                  work / "slotune.toml", lambda: launcher.stop(stack_cfg.run_dir))


def _listening(proc: subprocess.Popen, port: int, what: str) -> None:
    deadline = time.time() + 60
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            if time.time() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError(f"{what} did not start listening within 60 s") from None
            time.sleep(0.2)


def uvicorn_app(args, work: Path) -> Target:
    """A FastAPI app on uvicorn (bench/thirdparty_app.py) that exports no metrics and reads a
    real Redis per query: slotune sees both through eBPF only (Redis by the redis family)."""
    from reference_stack import launcher
    port, exporter, redis_port = launcher.free_ports(3)
    cache = subprocess.Popen(["redis-server", "--port", str(redis_port), "--save", "", "--appendonly", "no",
                              "--dir", str(work)], stdout=subprocess.DEVNULL)
    _listening(cache, redis_port, "redis-server")
    app = subprocess.Popen([sys.executable, "-m", "uvicorn", "bench.thirdparty_app:app", "--port", str(port),
                            "--workers", "1", "--no-access-log", "--log-level", "warning"], cwd=ROOT,
                           env={**os.environ, "REDIS_PORT": str(redis_port)})
    url = f"http://127.0.0.1:{port}"
    _listening(app, port, "the uvicorn app")
    (work / "slotune.toml").write_text(
        daemon_table(exporter, work) + f'[services.app]\ncmdline = "uvicorn bench.thirdparty_app:app --port {port}"\nport = {port}\n'
        f'slo_p99_ms = 1000.0\ndownstream = ["cache"]\n[services.app.peers]\n"{redis_port}" = "cache"\n\n'
        f'[services.cache]\nport = {redis_port}\nslo_p99_ms = 50.0\n')

    def stop() -> None:
        for proc in (app, cache):
            proc.kill()
            proc.wait()
    return Target("app", url + "/query", app_faults(url, port, args.rate, APP_CONTEXT_BYTES, redis_port),
                  work / "slotune.toml", stop, APP_CONTEXT_BYTES)


TARGETS = {"stack": reference_stack, "uvicorn": uvicorn_app}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", choices=TARGETS, default="stack",
                    help="stack: the reference stack, judged at its gateway; uvicorn: a FastAPI app seen by eBPF only")
    ap.add_argument("--runs", type=int, default=2, help="runs of each fault (default 2)")
    ap.add_argument("--faults", default="", help="comma-separated subset of the target's faults (a wrong name is refused with the list)")
    ap.add_argument("--rate", type=float, default=25.0, help="offered load, queries/s")
    ap.add_argument("--baseline-s", type=float, default=15.0, help="clean seconds before each fault")
    ap.add_argument("--fault-s", type=float, default=12.0, help="seconds each fault stays on")
    ap.add_argument("--settle", type=int, default=2, help="fault windows skipped before judging the steady verdict")
    ap.add_argument("--json", type=Path, default=None, help="also write every run's result here")
    ap.add_argument("--verbose", action="store_true", help="print the judged service's verdict each window")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("attribution_matrix: needs root (eBPF probes, tc, a network namespace)", file=sys.stderr)
        return 2
    enter_own_netns()
    from slotune import config as config_mod

    work = Path(tempfile.mkdtemp(prefix="slotune-matrix-"))
    t0 = time.time()
    target = TARGETS[args.target](args, work)
    loop = load = None
    faults = target.faults
    results = []
    try:
        if args.faults:
            wanted = args.faults.split(",")
            unknown = set(wanted) - {f.name for f in faults}
            if unknown:
                raise SystemExit(f"--faults: unknown {', '.join(sorted(unknown))}; "
                                 f"known: {', '.join(f.name for f in faults)}")
            faults = [f for f in faults if f.name in wanted]
        # The daemon before any query: the services open their pooled connections on the first
        # request, and the daemon owns a TCP connection only if it saw the connect (bpf/tcp.bpf.c).
        loop = DaemonLoop(config_mod.load(target.config))
        loop.start()
        total = 30 + args.runs * len(faults) * (args.baseline_s + args.fault_s) + 30
        load = subprocess.Popen([sys.executable, "-m", "reference_stack", "load", "--url", target.query_url,
                                 "--rate", str(args.rate), "--duration", str(total),
                                 "--context-bytes", str(target.context_bytes)], cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        print(f"{args.target} up in {time.time() - t0:.0f} s; warming up 20 s", flush=True)
        time.sleep(20)
        for run in range(args.runs):
            for fault in faults:
                time.sleep(args.baseline_s)
                fault.prepare()
                t_on = time.time()
                fault.inject()
                try:
                    time.sleep(args.fault_s)
                finally:
                    fault.remove()
                steps = [s for s in loop.steps if t_on < s[0] <= t_on + args.fault_s + 0.5]
                if getattr(fault, "parts", ()):
                    fault.parts, fault.in_order = in_order_of_growth(fault.parts, results)
                r = judge(fault, steps, t_on, args.settle, target.service)
                r["run"] = run
                results.append(r)
                order = f" (order {'asked' if fault.in_order else 'either: near growths alone'})" \
                    if getattr(fault, "parts", ()) else ""
                print(f"run {run + 1} {fault.name:<10} -> {r['reported']:<40} leaf share {r['leaf_share']:.0%} "
                      f"detected at window {r['detected_at']} (tail at {r['tail_at']}){order}", flush=True)
                if args.verbose:
                    print("   " + "\n   ".join(r["verdicts"]))
    finally:
        if load is not None:
            load.kill()
            load.wait()
        if loop is not None:
            loop.close()
        target.stop()
    print()
    print(report(results, faults, target.service))
    costs = sorted(loop.step_cost)
    print(f"\ndaemon step (collect + windows + attribution of {len(loop.daemon.cfg.services)} services): "
          f"median {costs[len(costs) // 2] * 1e3:.1f} ms, p95 {costs[int(len(costs) * 0.95)] * 1e3:.1f} ms")
    if loop.errors:
        print(f"daemon steps that raised: {len(loop.errors)} (first: {loop.errors[0]})")
    print(f"whole bench {time.time() - t0:.0f} s on {os.cpu_count()} CPUs; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
