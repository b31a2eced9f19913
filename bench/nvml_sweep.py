"""What one NVML sweep costs: on a GPU host, the wall time of NvmlCollector's
sweep of every GPU (median, p90, max); without a driver, what the failed start
and the down collector cost, so the README can quote both honestly.

    python -m bench.nvml_sweep [--sweeps 50] [--interval-ms 100]"""
from __future__ import annotations

import argparse
import statistics
import time

from slotune.collectors.gpu.device import log
from slotune.collectors.gpu.collector import NvmlCollector
from slotune.model.service import ServiceSpec


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def sweep_costs_ms(collector: NvmlCollector, sweeps: int, interval_s: float) -> list[float]:
    """Wall time of `sweeps` collect() calls, spaced like the daemon spaces them
    (GPM and per-process utilisation need time between samples)."""
    costs = []
    for i in range(sweeps):
        began = time.perf_counter()
        collector.collect(float(i), float(i + 1))
        costs.append((time.perf_counter() - began) * 1e3)
        time.sleep(interval_s)
    return costs


def summary_ms(costs: list[float]) -> str:
    return (f"median {statistics.median(costs):.3f} ms, p90 {percentile(costs, 0.9):.3f} ms, "
            f"max {max(costs):.3f} ms over {len(costs)} sweeps")


def no_gpu_figures(runs: int) -> str:
    starts, collects = [], []
    log.disabled = True  # the one start-up line was already printed; timing must not print it again
    for _ in range(runs):
        collector = NvmlCollector(pids_of=lambda service: set())
        began = time.perf_counter()
        collector.start([ServiceSpec("inference")])
        starts.append((time.perf_counter() - began) * 1e6)
        began = time.perf_counter()
        collector.collect(0.0, 1.0)
        collects.append((time.perf_counter() - began) * 1e6)
    log.disabled = False
    return (f"no GPU here ({collector.problem})\n"
            f"  failed start (NVML init, once per daemon start): median {statistics.median(starts):.1f} us "
            f"over {runs} runs\n"
            f"  collect() on the down collector (each interval):  median {statistics.median(collects):.2f} us\n"
            f"  the real sweep cost needs a GPU host: bash bench/gpu_check.sh")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.nvml_sweep", description=__doc__.splitlines()[0])
    parser.add_argument("--sweeps", type=int, default=50, help="sweeps to time on a GPU host (default 50)")
    parser.add_argument("--interval-ms", type=float, default=100, help="pause between sweeps (default 100)")
    parser.add_argument("--no-gpu-runs", type=int, default=200, help="failed starts to time without a GPU")
    args = parser.parse_args(argv)
    if args.sweeps < 1 or args.no_gpu_runs < 1:
        parser.error("--sweeps and --no-gpu-runs must be at least 1")
    probe = NvmlCollector(pids_of=lambda service: set())
    probe.start([])
    if not probe.up:
        print(no_gpu_figures(args.no_gpu_runs))
        return 0
    try:
        # Every process on the host counts as one service, so the PID mapping is part of the cost.
        probe.update_services([ServiceSpec("all")])
        probe.pids_of = lambda service: {pid for gpu in probe.latest.gpus for pid in gpu.processes}
        costs = sweep_costs_ms(probe, args.sweeps, args.interval_ms / 1e3)
        names = ", ".join(str(d) for d in probe.devices)
        print(f"NVML sweep of {len(probe.devices)} GPU(s) [{names}]: {summary_ms(costs)}")
    finally:
        probe.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
