"""The GPU host check behind bench/gpu_check.sh: runs the reference stack's
inference server on CUDA under load with the NVML collector attached to its
PIDs, and prints the service's GPU metrics, one sweep's cost, what changes
when a second process saturates the GPU (and what the attribution says), and
the batch-size vs throughput curve.

    python -m bench.gpu_check run [--seconds 15] [--clients 32]
    python -m bench.gpu_check saturate --seconds 20     # the second process (CUDA matmuls)"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
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

import psutil

from bench.nvml_sweep import summary_ms
from slotune.collectors.gpu import collector as nvml
from slotune.collectors.gpu.collector import NvmlCollector, Sweep
from slotune.model.service import ServiceSpec

NO_GPU_EXIT = 3
SERVICE = "inference"
DEFAULT_SERVER = "{python} -m reference_stack inference --device {device} --port {port} --run-dir {run_dir}"
SIGNALS = ("gpu_memory_bytes", "gpu_utilization_ratio", "gpu_saturation_ratio", "gpu_membw_ratio",
           "gpu_pcie_ratio", "gpu_throttled", "gpu_headroom_ratio")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def service_pids(root_pid: int) -> set[int]:
    """The service's host PIDs: the process we started and all its children."""
    try:
        root = psutil.Process(root_pid)
        return {root_pid, *(child.pid for child in root.children(recursive=True))}
    except psutil.NoSuchProcess:
        return set()


def stop(proc: subprocess.Popen | None) -> None:
    """Stop a process group we started: SIGTERM, then SIGKILL after 10 s."""
    if proc is None or proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def server_command(template: str, port: int, run_dir: str, device: str = "cuda") -> list[str]:
    return shlex.split(template.format(python=sys.executable, port=port, run_dir=run_dir, device=device))


def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with status {proc.returncode} before answering {url}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"{url} did not answer within {timeout_s:.0f} s")


@dataclass
class Load:
    """Closed-loop clients POSTing JSON to one URL until stopped; counts outcomes."""
    url: str
    clients: int
    body: dict = field(default_factory=lambda: {"prompt": "why is the tail latency high", "max_new_tokens": 32})
    ok: int = 0
    errors: int = 0
    latencies_s: list[float] = field(default_factory=list)

    def __post_init__(self):
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._client, daemon=True) for _ in range(self.clients)]

    def _client(self) -> None:
        data = json.dumps(self.body).encode()
        while not self._stop.is_set():
            began = time.monotonic()
            request = urllib.request.Request(self.url, data, {"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=30) as resp:
                    resp.read()
                outcome = True
            except OSError:
                outcome = False
            with self._lock:
                if outcome:
                    self.ok += 1
                    self.latencies_s.append(time.monotonic() - began)
                else:
                    self.errors += 1

    def __enter__(self) -> "Load":
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(35)

    def summary(self) -> str:
        with self._lock:
            lat = sorted(self.latencies_s)
        if not lat:
            return f"0 answers, {self.errors} errors"
        p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))]
        return f"{len(lat)} answers, {self.errors} errors, P50 {statistics.median(lat) * 1e3:.0f} ms, P99 {p99 * 1e3:.0f} ms"


def watch(collector: NvmlCollector, seconds: float) -> tuple[list[dict], list[float]]:
    """Collect once a second; the inference service's gauges per interval and each sweep's ms."""
    gauges, costs = [], []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(1.0)
        began = time.perf_counter()
        found = collector.collect(time.time() - 1.0, time.time())
        costs.append((time.perf_counter() - began) * 1e3)
        gauges += [{key: value for (key, _), value in s.gauges.items()} for s in found if s.service == SERVICE]
    return gauges, costs


def mean_signals(gauges: list[dict]) -> dict[str, float]:
    return {k: statistics.fmean(g.get(k, 0.0) for g in gauges) for k in SIGNALS} if gauges else {}


def format_signals(title: str, signals: dict[str, float]) -> str:
    lines = [title]
    for key in SIGNALS:
        v = signals.get(key)
        shown = "absent" if v is None else (f"{v / 2**20:.0f} MiB" if key.endswith("_bytes") else f"{v:.3f}")
        lines.append(f"  {key:<24} {shown}")
    return "\n".join(lines)


def format_gpus(sweep: Sweep) -> str:
    lines = []
    for gpu in sweep.gpus:
        v = gpu.values
        lines.append(f"  GPU {gpu.index} {gpu.name} {gpu.uuid} up={int(gpu.up)} "
                     f"util={v.get('utilization_ratio', float('nan')):.2f} "
                     f"dram_bw={v.get('dram_bandwidth_utilization_ratio', float('nan')):.2f} "
                     f"fb_used={v.get('framebuffer_used_bytes', 0) / 2**30:.1f} GiB "
                     f"sm_clock={v.get('sm_clock_hertz', 0) / 1e6:.0f} MHz power={v.get('power_watts', 0):.0f} W "
                     f"temp={v.get('temperature_celsius', 0):.0f} C "
                     f"clock_events={[r for r, on in gpu.clock_events.items() if on]} "
                     f"processes={len(gpu.processes)}")
    return "\n".join(lines)


def verdict(signals: dict[str, float]) -> tuple[bool, str]:
    memory, utilization = signals.get("gpu_memory_bytes", 0.0), signals.get("gpu_utilization_ratio", 0.0)
    ok = memory > 0 and utilization > 0
    return ok, (f"{'PASS' if ok else 'FAIL'}: {SERVICE} holds {memory / 2**20:.0f} MiB and "
                f"{utilization:.1%} of its GPU by its own PIDs (both must be > 0)")


def attribution_command_available() -> bool:
    from slotune.cli import subcommand_modules
    return any(module.NAME == "attribute" for module in subcommand_modules())


def attribution(service: str, timeout_s: float = 60) -> str:
    """What `slotune attribute SERVICE` reports, or a clear line saying it cannot yet."""
    if not attribution_command_available():
        return (f"slotune attribute is not in this checkout yet (no daemon/commands/attribute.py): "
                f"no attribution verdict; the GPU cause signals it will read for {service} are printed above")
    try:
        result = subprocess.run([sys.executable, "-m", "slotune.cli", "attribute", service], capture_output=True,
                                text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"slotune attribute {service} gave no answer within {timeout_s:.0f} s"
    return f"$ slotune attribute {service}   (exit {result.returncode})\n{result.stdout}{result.stderr}".rstrip()


def capacity_curve(timeout_s: float) -> str:
    """The batch-size vs throughput curve from the reference stack's own benchmark, on CUDA."""
    if importlib.util.find_spec("bench.stack_capacity") is None:
        return "bench/stack_capacity.py is not in this checkout yet: no batch-size vs throughput curve"
    env = dict(os.environ, SLOTUNE_STACK_DEVICE="cuda")
    try:
        result = subprocess.run([sys.executable, "-m", "bench.stack_capacity"], capture_output=True, text=True,
                                timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return f"python -m bench.stack_capacity did not finish within {timeout_s:.0f} s"
    return f"$ python -m bench.stack_capacity   (exit {result.returncode})\n{result.stdout}{result.stderr}".rstrip()


def saturate(seconds: float) -> int:
    """Keep the GPU's SMs and memory busy with fp16 matmuls for `seconds`."""
    import torch
    if not torch.cuda.is_available():
        print("saturate: torch sees no CUDA device (CPU build of torch, or no GPU): nothing to saturate",
              file=sys.stderr)
        return NO_GPU_EXIT
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    end, steps = time.monotonic() + seconds, 0
    began = time.monotonic()
    while time.monotonic() < end:
        for _ in range(10):
            a = (a @ a).clamp_(-1, 1)
        torch.cuda.synchronize()
        steps += 10
    tflops = 2 * 8192**3 * steps / (time.monotonic() - began) / 1e12
    print(f"saturate: {steps} fp16 8192x8192 matmuls, {tflops:.0f} TFLOP/s", flush=True)
    return 0


def run(args) -> int:
    ok, detail, fix = nvml.probe()
    if not ok:
        print(f"gpu_check: no usable NVIDIA GPU: {detail}\n  fix: {fix}\n"
              "  run this on a GPU host; nothing was started", file=sys.stderr)
        return NO_GPU_EXIT
    print(f"== NVML: {detail}", flush=True)
    started = time.monotonic()
    port = args.port or free_port()
    cmd = server_command(args.server_cmd, port, tempfile.mkdtemp(prefix="slotune-gpu-check-"))
    server = saturator = None
    collector = NvmlCollector(pids_of=lambda service: service_pids(server.pid) if server else set())
    try:
        print(f"== starting the inference server on CUDA: {' '.join(cmd)}", flush=True)
        server = subprocess.Popen(cmd, start_new_session=True)
        wait_healthy(f"http://127.0.0.1:{port}/healthz", server, args.start_timeout)
        collector.start([ServiceSpec(SERVICE)])
        with Load(f"http://127.0.0.1:{port}/generate", args.clients) as load:
            gauges, costs = watch(collector, args.seconds)
            alone = mean_signals(gauges)
            print(format_signals(f"== {SERVICE} alone under load, mean of {len(gauges)} intervals:", alone))
            print(format_gpus(collector.latest))
            passed, line = verdict(alone)
            print(line)
            print(f"== one NVML sweep (all GPUs + PID mapping): {summary_ms(costs)}")
            print(f"   load: {load.summary()}", flush=True)
            saturator = subprocess.Popen([sys.executable, "-m", "bench.gpu_check", "saturate",
                                          "--seconds", str(args.seconds + 10)], start_new_session=True)
            time.sleep(3)  # CUDA context and the first matmuls
            gauges, _ = watch(collector, args.seconds)
            print(format_signals(f"== {SERVICE} with a second process saturating the GPU:", mean_signals(gauges)))
            print(format_gpus(collector.latest))
            print(f"   load: {load.summary()}")
            print("== attribution:\n" + attribution(SERVICE), flush=True)
        stop(saturator)
        stop(server)
        collector.close()
        left = max(30.0, args.budget - (time.monotonic() - started))
        print("== batch size vs throughput on CUDA:\n" + capacity_curve(left), flush=True)
    except RuntimeError as exc:
        print(f"gpu_check: {exc}", file=sys.stderr)
        return 1
    finally:
        stop(saturator)
        stop(server)
        collector.close()
    print(f"== done in {time.monotonic() - started:.0f} s")
    return 0 if passed else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_check", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="step", required=True)
    check = sub.add_parser("run", help="the whole GPU host check")
    check.add_argument("--seconds", type=float, default=15, help="each watch phase (default 15)")
    check.add_argument("--clients", type=int, default=32, help="concurrent load clients (default 32)")
    check.add_argument("--port", type=int, default=0, help="inference server port (default: a free one)")
    check.add_argument("--server-cmd", default=DEFAULT_SERVER,
                       help="command starting the inference server; {python}, {port}, {run_dir} and "
                            "{device} (cuda) are filled in "
                            f"(default: {DEFAULT_SERVER})")
    check.add_argument("--start-timeout", type=float, default=120, help="seconds for the server to answer")
    check.add_argument("--budget", type=float, default=280, help="seconds the whole check may take (default 280)")
    sat = sub.add_parser("saturate", help="keep the GPU busy with CUDA matmuls (the second process)")
    sat.add_argument("--seconds", type=float, default=20)
    args = parser.parse_args(argv)
    if args.step == "saturate":
        return saturate(args.seconds)
    if args.seconds <= 0 or args.clients < 1:
        parser.error("--seconds must be > 0 and --clients at least 1")
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
