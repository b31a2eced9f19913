"""`python -m bench [NAME ...]` (what `make bench` runs): each benchmark in turn,
printing the figures the README quotes. Without names, all but the GPU check and
the long ones run by name (ON_REQUEST: the hour's soak, `python -m bench soak`;
the closed-loop arms; the LLM tuning arms)."""
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
    "bpf_primitives": "ns each of the operations the probes are built from (a clock read, a user read, a lookup) on this kernel (~1 min)",
    "server_overhead": "nginx under wrk with and without the probes, beside bpftrace: req/s, CPU and BPF time per request (~6 min)",
    "signal_checks": "every signal against its independent reference (nstat, ss, bpftrace, s_time, server logs) (~5 min)",
    "step_time_fit": "the reference decoder's step time a + b*tokens + c*seqs, for the LLM simulator (~1 min)",
    "chaos": "3 healthy services tuned beside 10 hostile ones, clock steps, a SIGHUP a second: decisions missed, restarts, RSS (~21 min)",
    "scale": "daemon CPU, RSS, tick P99 and /metrics size for 1, 10, 50 services x 0, 20 000 idle connections (~7 min)",
    "soak": "an hour of diurnal load with SIGHUPs and gateway restarts: daemon RSS, fds, logs (~62 min)",
    "closed_loop": "the real stack under a load step and a diurnal day: shipped, whitepaper, slotune, oracle arms (~25 min)",
    "llm_tuning": "the continuous-batch tuner against the LLM server's defaults on the real stack (~15 min)",
    "engine_loop": "a real HAProxy before a real vLLM under a load step: none, static, aimd, slotune arms (~13 min)",
}
# too long for every `make bench`, or a demonstration more than a figure: run by name
ON_REQUEST = {"soak", "closed_loop", "llm_tuning", "engine_loop"}


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
