"""`python -m bench [NAME ...]` (what `make bench` runs): each benchmark in turn,
printing the figures the README quotes. Without names, all but the GPU check and
the soak (an hour: `python -m bench soak`, or `python -m bench.soak --minutes N`)."""
from __future__ import annotations

import importlib
import sys
import time

BENCHES = {
    "tuners": "every tuner policy x scenario in the simulator (~5 min)",
    "stack_capacity": "reference stack throughput and P50/P99 per batch size (~3 min)",
    "probe_overhead": "ns per syscall added by each probe family, vs none and an empty program (~2 min)",
    "daemon_footprint": "daemon CPU and RSS idle and under load, beside the stack's CPU (~1 min)",
    "attribution_matrix": "fault injection: injected cause x reported top cause (~10 min)",
    "nvml_sweep": "cost of one NVML sweep (GPU hosts; the failure path elsewhere)",
    "soak": "an hour of diurnal load with SIGHUPs and gateway restarts: daemon RSS, fds, logs (~62 min)",
}
ON_REQUEST = {"soak"}   # too long for every `make bench`: run by name


def main(argv: list[str]) -> int:
    names = argv or [n for n in BENCHES if n not in ON_REQUEST]
    unknown = [n for n in names if n not in BENCHES]
    if unknown:
        print(f"unknown benchmark {', '.join(unknown)}; known:\n" +
              "\n".join(f"  {n:<20} {what}" for n, what in BENCHES.items()), file=sys.stderr)
        return 2
    for name in names:
        print(f"\n=== bench.{name}: {BENCHES[name]}", flush=True)
        started = time.monotonic()
        sys.argv = [f"bench.{name}"]          # each parses its own (empty) arguments
        rc = importlib.import_module(f"bench.{name}").main()
        print(f"=== bench.{name} done in {time.monotonic() - started:.0f} s (exit {rc or 0})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
