"""The dimmer against an overload step on the real stack: the same step at 1.5 x the
stack's paced capacity (tests/e2e/conftest.py PACE: the same on any host), once with the throttle alone and once with the degrade tuner
beside it (each a real `slotune run`, closed loop); once the tuners have acted (the step's
second half) the dimmer answers degraded where the throttle alone refuses with 429, P99
ends under the SLO, and when the load drops degrade_ratio goes back to 0. The daemon runs
without eBPF probes (the tuners read the gateway's own /metrics), so that it starts in a
second or two."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from reference_stack import launcher, loadgen
from reference_stack.client import StackClient
from tests.e2e.conftest import ANSWER_TOKENS, PACE, daemon_config

START_LIMIT = 32     # the gateway's concurrency limit as the stack starts
CAPACITY = PACE.capacity(1, ANSWER_TOKENS)   # full answers a second at batch 1: 15
SLO_MS = 1000        # START_LIMIT full answers in flight wait 2.1 s: the step breaks it by construction


THROTTLE = "[services.gateway.tuners.throttle]\ninterval_s = 1.0\n"
DEGRADE = "[services.gateway.tuners.degrade]\ninterval_s = 1.0\n"
STEP_S, LOW_S = 18.0, 8.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """Paced, at batch 1: a full answer (tools, 12 tokens: 66 ms) costs 12 degraded ones (no
    tools, 1 token), so the stack carries the step degraded but not in full."""
    cfg = launcher.StackConfig.on_free_ports(
        tmp_path_factory.mktemp("degrade-stack"), inference_args=launcher.PACED,
        settings={"inference": {"max_batch_size": 1},
                  "gateway": {"concurrency_limit": START_LIMIT, "degrade_max_tokens": 1}})
    state = launcher.start(cfg)
    try:
        yield StackClient(state)
    finally:
        launcher.stop(cfg.run_dir)


def late_refusals(records) -> int:
    """429s in the step's second half: its first seconds, before any tuner has acted, refuse
    alike with the dimmer or without (the queue fills the starting limit)."""
    return sum(r.outcome == "rejected" and r.t_s >= STEP_S / 2 for r in records)


def run_step(stack, daemon, rate: float, low_s: float = 0.0) -> tuple[list, list]:
    """The step (then low_s at a tenth of it); the client's records and, each second,
    (seconds from the start, the daemon's gateway P99, degrade_ratio, concurrency_limit)."""
    records, trace, done = [], [], threading.Event()

    def load():
        records.extend(loadgen.run_load(stack.state["query_url"], rate, STEP_S, seed=5))
        if low_s:
            loadgen.run_load(stack.state["query_url"], rate / 10, low_s, seed=6)
        done.set()

    threading.Thread(target=load, daemon=True).start()
    t0 = time.time()
    while not done.wait(1.0):
        settings = stack.settings("gateway")
        trace.append((time.time() - t0, daemon.status()["services"]["gateway"]["p99_s"],
                      settings["degrade_ratio"], settings["concurrency_limit"]))
    return records, trace


def test_the_dimmer_answers_an_overload_step_degraded_where_the_throttle_alone_refuses(stack, daemon_factory):
    rate, slo = 1.5 * CAPACITY, SLO_MS

    def config(tuners):
        return lambda port, work: daemon_config(stack.state, port, work, gateway_slo_ms=slo,
                                                gateway_tuners=tuners).replace("[daemon]\n", "[daemon]\nprobes = []\n")

    # Both runs start from cold caches: warm, the tools cost nothing and the first run's answers
    # come sooner.
    alone = daemon_factory(config(THROTTLE), name="throttle-alone")
    records, trace_alone = run_step(stack, alone, rate)
    refused_alone = late_refusals(records)
    alone.stop()
    stack.patch("gateway", concurrency_limit=START_LIMIT)
    stack.admin("gateway", "POST", {"level": "all"}, path="/admin/cache/flush")

    dimmed = daemon_factory(config(THROTTLE + DEGRADE), name="with-degrade")
    records, trace = run_step(stack, dimmed, rate, LOW_S)
    outcomes = [r.outcome for r in records]
    for name, t in (("throttle alone", trace_alone), ("with the dimmer", trace)):
        print(f"{name}, paced capacity {CAPACITY:.1f} q/s, SLO {slo:.0f} ms: (s, P99, degrade_ratio, limit)",
              [(round(s), p and round(p, 2), round(r, 2), lim) for s, p, r, lim in t])
    half = sum(r.t_s >= STEP_S / 2 for r in records)
    assert refused_alone >= 0.1 * half, f"the throttle alone refused only {refused_alone} of {half} late in the step"
    assert late_refusals(records) <= refused_alone / 2, (late_refusals(records), refused_alone,
                                                         [t[2:] for t in trace], [t[2:] for t in trace_alone])
    # degrading is what took the refusals' place: a sixth of the run at least (the step's first
    # seconds come before any tuner acts; carrying 1.5 x capacity takes a degrade_ratio of 0.36)
    assert outcomes.count("degraded") >= 0.15 * len(outcomes), f"the dimmer degraded {outcomes.count('degraded')}"
    late = [p99 for t, p99, _, _ in trace if STEP_S - 6 <= t < STEP_S and p99 is not None]
    assert late and float(np.median(late)) <= slo / 1e3, f"gateway P99 late in the step: {late}"
    assert max(ratio for t, _, ratio, _ in trace if t < STEP_S) > 0.3, trace
    low = [ratio for t, _, ratio, _ in trace if t >= STEP_S]
    # back to 0 within the low phase; a one-second blip after (a 0.05 at a few queries a second) is noise
    assert 0.0 in low and low[-1] <= 0.1, f"degrade_ratio after the load dropped: {low}"
    assert any(e["setting"] == "degrade_ratio" and e["new"] == 0.0 and e["outcome"] == "pushed"
               for e in dimmed.audit()), "no decision put degrade_ratio back to 0"
