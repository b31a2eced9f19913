"""The whole loop: a load step past capacity makes the daemon's throttle and
batch tuners push new settings to the real stack and bring P99 back under the
SLO; less load relaxes them; --dry-run pushes nothing. The stack's capacity is
paced (tests/e2e/conftest.py PACE): the step is 1.5 x what batch 1 serves on any
host, so P99 breaks the SLO by construction (64 queries in flight wait 4 s)."""
import re
import threading
import time

from reference_stack import loadgen
from tests.e2e.conftest import ANSWER_TOKENS, PACE, daemon_config

TUNERS_GATEWAY = "[services.gateway.tuners.throttle]\ninterval_s = 1.0\n"
TUNERS_INFERENCE = "[services.inference.tuners.batch]\ninterval_s = 3.0\n"
HIGH_X, HIGH_S, LOW_X, LOW_S = 1.5, 36.0, 0.15, 20.0     # load steps, times the capacity
START_LIMIT = 64     # the gateway's concurrency limit as the stack starts
RATE = PACE.capacity(1, ANSWER_TOKENS)     # the stack's capacity at batch 1: 15 answers/s
SLO_S = 0.8


def drive(stack, daemon, phases):
    """Run load phases (rate, longest seconds, done(rows of this phase) or None) in the background,
    sampling /status and the stack's settings every second; a phase ends early once done() holds
    (the test polls for its outcome; the longest time is the deadline)."""
    trace, finished, phase = [], threading.Event(), [0]
    stops = [threading.Event() for _ in phases]

    def load():
        for i, (rate, seconds, _) in enumerate(phases):
            phase[0] = i
            loadgen.run_load(stack.state["query_url"], rate, seconds, seed=int(rate), until=stops[i])
        finished.set()

    threading.Thread(target=load, daemon=True).start()
    t0 = time.time()
    while not finished.is_set():
        s = daemon.status()["services"]
        i = phase[0]
        trace.append({"t": time.time() - t0, "phase": i, "gateway_p99": s["gateway"]["p99_s"],
                      "limit": stack.settings("gateway")["concurrency_limit"],
                      "batch": stack.settings("inference")["max_batch_size"]})
        done = phases[i][2]
        if done is not None and done([r for r in trace if r["phase"] == i], daemon):
            stops[i].set()
        time.sleep(1.0)
    return trace


def p99_back(rows, _daemon) -> bool:
    """Both tuners have acted and the median of the last 8 P99 readings is under the SLO."""
    late = [r["gateway_p99"] for r in rows[-8:] if r["gateway_p99"] is not None]
    return (len(rows) >= 20 and len(late) == 8 and sorted(late)[4] <= SLO_S
            and min(r["limit"] for r in rows) < START_LIMIT and max(r["batch"] for r in rows) > 1)


def test_load_step_pushes_settings_brings_p99_back_and_relaxes(stack, daemon_factory, fresh_settings):
    rate, slo = RATE, SLO_S
    d = daemon_factory(lambda port, work: daemon_config(stack.state, port, work, gateway_slo_ms=round(slo * 1e3),
                                                  gateway_tuners=TUNERS_GATEWAY, inference_tuners=TUNERS_INFERENCE))
    lowest = [START_LIMIT]     # the step's lowest concurrency limit so far

    def high_done(rows, daemon):
        lowest[0] = min(r["limit"] for r in rows)
        return p99_back(rows, daemon)

    def relaxed(rows, _daemon):
        return len(rows) >= 5 and rows[-1]["limit"] > lowest[0]

    trace = drive(stack, d, [(HIGH_X * rate, HIGH_S, high_done), (LOW_X * rate, LOW_S, relaxed)])
    high = [r for r in trace if r["phase"] == 0]
    low = [r for r in trace if r["phase"] == 1]
    print(f"paced capacity {rate:.1f} q/s, SLO {slo} s; P99 each second:", [r["gateway_p99"] and round(r["gateway_p99"], 2)
                                                                      for r in trace])
    assert max(r["gateway_p99"] or 0 for r in high[:15]) > slo, "the step never pushed P99 over the SLO"
    late = [r["gateway_p99"] for r in high[-8:] if r["gateway_p99"] is not None]
    assert sorted(late)[len(late) // 2] <= slo, f"P99 not back under the SLO late in the step: {late}"
    assert min(r["limit"] for r in high) < START_LIMIT and max(r["batch"] for r in high) > 1
    assert low[-1]["limit"] > min(r["limit"] for r in high), "less load did not relax the concurrency limit"
    logs = {name: (stack.run_dir / f"{name}.log").read_text() for name in ("gateway", "inference")}
    assert "concurrency_limit" in logs["gateway"] and "max_batch_size" in logs["inference"]
    pushed = [e for e in d.audit() if e["outcome"] == "pushed"]
    assert {e["setting"] for e in pushed} >= {"concurrency_limit", "max_batch_size"}
    bounds = {"concurrency_limit": (2, 256), "max_batch_size": (1, 64), "max_queue_delay_ms": (0, 50)}
    assert all(bounds[e["setting"]][0] <= e["new"] <= bounds[e["setting"]][1] for e in pushed)


def test_dry_run_decides_but_pushes_nothing(stack, daemon_factory, fresh_settings):
    d = daemon_factory(lambda port, work: daemon_config(stack.state, port, work, gateway_slo_ms=round(SLO_S * 1e3),
                                                        gateway_tuners=TUNERS_GATEWAY,
                                                        inference_tuners=TUNERS_INFERENCE), "--dry-run")
    drive(stack, d, [(HIGH_X * RATE, 12.0, lambda rows, d: any(e["outcome"] == "dry-run" for e in d.audit()))])
    outcomes = {e["outcome"] for e in d.audit()}
    assert "dry-run" in outcomes and "pushed" not in outcomes
    assert stack.settings("gateway")["concurrency_limit"] == START_LIMIT
    assert stack.settings("inference")["max_batch_size"] == 1
    assert d.status()["dry_run"] is True
    assert re.search(r'slotune_tuner_decisions_total\{[^}]*outcome="dry_run"[^}]*\} [1-9]', d.metrics())


def test_a_gateway_with_no_concurrency_limit_is_not_given_one(stack, daemon_factory, fresh_settings):
    """The gateway's own 0 = no limit: the throttle stops, saying why, and pushes nothing
    (it used to read 0 as a binding limit of 1 and push the bound's minimum, 2)."""
    stack.patch("gateway", concurrency_limit=0)
    d = daemon_factory(lambda port, work: daemon_config(stack.state, port, work, gateway_slo_ms=800,
                                                        gateway_tuners=TUNERS_GATEWAY))
    trace = drive(stack, d, [(0.5 * RATE, 8.0, lambda rows, d: any(e["detail"] == "tuner stopped"
                                                                     for e in d.audit()))])
    assert {r["limit"] for r in trace} == {0}, "the gateway was given a concurrency limit"
    audit = d.audit()
    assert not [e for e in audit if e["outcome"] == "pushed"]
    stopped = [e for e in audit if e["outcome"] == "refused" and e["detail"] == "tuner stopped"]
    assert stopped and stopped[0]["tuner"] == "throttle"
    assert "concurrency_limit is 0 in force, which the service reads as no limit" in stopped[0]["reason"]
