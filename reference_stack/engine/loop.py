"""The closed loop on a real engine, as the bench (bench/engine_loop.py), the test
(tests/engines/test_vllm_loop.py) and `slotune demo --engine vllm` run it: vLLM
(serve.SMALL_ENGINE) behind HAProxy (proxy.py), the daemon observing vLLM and
pushing HAProxy's server maxconn (`admission_by`), steering on TTFT. The load is
made from vLLM's capacity C measured on this host (measure_capacity) and sent by a
client at real-time priority (loadgen.realtime()): on 2 cores vLLM's worker spins on
one core and its scheduler, API server and HAProxy share the other, and a client at
normal priority reads its answers late, which every arm's TTFT then carries whatever
the limit (measured 2026-12-07: with maxconn 4, client TTFT P50 1.4 s at 2 C where
Little's law gives ~0.25 s in the engine)."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from reference_stack.engine import serve
from reference_stack.engine.proxy import Haproxy, haproxy
from reference_stack.llm.load import Lengths, run_llm_load
from reference_stack.loadgen import realtime

TTFT_SLO_MS, TPOT_SLO_MS = 1000, 50
QUEUE_TIMEOUT_MS = 50         # a request HAProxy cannot hand on within this gets its 503 at once
START = 64                    # HAProxy's server maxconn at the start, and the throttle's max
MEASURE_MAXCONN = 8           # in vLLM while its capacity is measured: twice its batch (SMALL_ENGINE: 4)
PROMPT, ANSWER = Lengths(900, 0, 900, "fixed"), Lengths(32, 0, 32, "fixed")
STREAM = {"ignore_eos": True, "stream_options": {"include_usage": True}}   # every answer its max_tokens long


def admission_config(engine_port: int, hp: Haproxy, exporter_port: int, work: Path, policy: str) -> str:
    """The daemon's config: vLLM observed, its TTFT objective, throttled at HAProxy (admission_by)."""
    return f"""[daemon]
collect_interval_s = 1.0
exporter_address = "127.0.0.1:{exporter_port}"
baseline_store = "{work}/baselines.sqlite"
audit_log = "{work}/audit.jsonl"
state_file = "{work}/state.json"
environment = "test"
probes = ["http"]

[services.vllm]
port = {engine_port}
profile = "vllm"
metrics_url = "http://127.0.0.1:{engine_port}/metrics"
routes = ["/v1/completions", "/v1/chat/completions"]
slo_p99_ms = 5000
slo_ttft_p99_ms = {TTFT_SLO_MS}
admission_by = "front"
[services.vllm.tuners.throttle]
policy = "{policy}"
[services.vllm.settings.concurrency_limit]
min = 1
max = {START}
max_step = {START // 2}
integer = true

[services.front]
port = {hp.port}
profile = "haproxy"
metrics_url = "{hp.metrics_url}"
[services.front.control]
kind = "haproxy"
address = "{hp.socket}"
[services.front.control.targets]
concurrency_limit = "{hp.target}"
"""


def measure_capacity(engine_port: int, folder: Path) -> float:
    """Completions per second under an overload (60 req/s for 6 s) through a HAProxy that
    keeps MEASURE_MAXCONN in vLLM and the rest waiting in its own queue: the engine's batch
    always full, its API server not flooded. At a wide limit (1000) the same measure read
    27.5 req/s where maxconn 16 then served 28.9 a second over a step of which half was
    at 0.5 C (2026-12-07): the API server's backlog, not the engine, set it."""
    with haproxy(folder, engine_port, MEASURE_MAXCONN) as hp, realtime():
        records = run_llm_load(f"http://127.0.0.1:{hp.port}/v1/completions", 60.0, 6.0, PROMPT, ANSWER,
                               model=serve.SERVED_NAME, extra=STREAM, seed=8)
    ends = sorted(r.t_s + r.start_delay_s + r.e2e_s for r in records if r.ok)
    if len(ends) < 2:
        raise RuntimeError(f"vLLM completed {len(ends)} of {len(records)} requests while measuring its capacity")
    return (len(ends) - 1) / (ends[-1] - ends[0])


def drive(url: str, capacity: float, step, seed: int, marks: list | None = None) -> list[tuple[float, object]]:
    """The step, phase after phase ((x capacity, seconds) each), from a real-time client:
    (seconds from its start, record) of each request; marks gets (time.time(), label) per phase."""
    out, t0 = [], time.monotonic()
    with realtime():
        for i, (x, seconds) in enumerate(step):
            if marks is not None:
                marks.append((time.time(), f"{x:g} C"))
            began = time.monotonic() - t0
            out += [(began + r.t_s, r) for r in run_llm_load(url, x * capacity, seconds, PROMPT, ANSWER,
                                                             model=serve.SERVED_NAME, extra=STREAM, seed=seed + i)]
    return out


def score(records, seconds: float) -> dict:
    """From the client's clock: seconds whose TTFT P99 (of answers begun in it) is over the
    objective, goodput (answers meeting the TTFT and TPOT objectives per second), refused
    share (503), TTFT P50/P99 in ms."""
    served = [(t, r) for t, r in records if r.status == 200 and not r.error]
    ttft = np.array([r.ttft_s for _, r in served])
    over = 0
    for s in range(int(seconds)):
        began = [r.ttft_s for t, r in served if s <= t < s + 1]
        over += bool(began) and float(np.quantile(began, 0.99)) > TTFT_SLO_MS / 1e3
    good = [r for _, r in served if r.ttft_s <= TTFT_SLO_MS / 1e3 and (r.output_tokens < 2 or r.tpot_s <= TPOT_SLO_MS / 1e3)]
    return {"over_s": over, "goodput_rps": len(good) / seconds,
            "refused": sum(r.status == 503 for _, r in records) / max(len(records), 1),
            "ttft_p50_ms": float(np.median(ttft)) * 1e3 if len(ttft) else float("nan"),
            "ttft_p99_ms": float(np.quantile(ttft, 0.99)) * 1e3 if len(ttft) else float("nan")}
