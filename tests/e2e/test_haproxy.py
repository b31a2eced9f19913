"""slotune tunes a real HAProxy (Debian's 2.6) in front of the reference inference
server (request-level /generate, one request per batch, paced: tests/e2e/conftest.py
PACE, so its capacity is the same on any host) with the config `slotune
discover --write` makes for HAProxy's frontend port (its stats socket, the server's
maxconn target and bounds read from haproxy.cfg, the SLO from --slo-ms); the test
adds only the [daemon] table. A load step past the server's capacity makes the
throttle lower HAProxy's server maxconn through the runtime API (read independently
with `show stat`: HAProxy 2.6's `show servers state` has no maxconn column) and P99
comes back under the SLO; once the load drops under the capacity, the throttle
raises maxconn back toward the limit HAProxy started with (in 5 runs on 2026-12-01
the first raise came 1 to 3 s after the drop; LOW_S leaves room). The throttle observes
HAProxy itself: the latency from the kernel (the http probe family on HAProxy's
frontend port: its exporter keeps no histogram), the requests in flight from its
exporter (profile haproxy: backend current sessions, queued ones included).
Requests HAProxy cannot hand to the server within 20 ms get its 503 (timeout queue)."""
import asyncio
import math
import random
import threading
import time

import aiohttp
import numpy as np

from slotune import config
from reference_stack import launcher
from tests.actuators.real_servers import haproxy
from tests.conftest import run_slotune
from tests.e2e.conftest import ANSWER_TOKENS, PACE, daemon_table
from tests.stack.conftest import one_service

SLO_MS, QUEUE_TIMEOUT_MS = 600, 20
HIGH_S, LOW_S = 22.0, 12.0
HIGH_X, LOW_X = 2.0, 0.4     # the load steps, times the server's paced capacity
CAPACITY = PACE.capacity(1, ANSWER_TOKENS)    # 15 answers/s at batch 1


async def _load(url: str, phases, out: list) -> None:
    """Open-loop Poisson arrivals: (sent at, latency, status) of every POST /generate."""
    rng = random.Random(17)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        async def one(sent):
            try:
                async with session.post(url, json={"prompt": "a short prompt"}) as r:
                    await r.read()
                    out.append((sent, time.monotonic() - sent, r.status))
            except aiohttp.ClientError:
                out.append((sent, time.monotonic() - sent, 0))
        tasks = []
        for rate, seconds in phases:
            end = time.monotonic() + seconds
            while (now := time.monotonic()) < end:
                tasks.append(asyncio.ensure_future(one(now)))
                await asyncio.sleep(rng.expovariate(rate))
        await asyncio.gather(*tasks)


def discovered(hp, path) -> str:
    """What `slotune discover` writes for HAProxy's frontend port, as it wrote it; the service's name."""
    wrote = run_slotune("discover", "--timeout", "2", "--pick", str(hp.port), "--slo-ms", str(SLO_MS),
                        "--write", str(path))
    assert wrote.returncode == 0, wrote.stdout + wrote.stderr
    print(path.read_text())
    return config.load(path).services[0].spec.name


def test_load_step_lowers_haproxy_maxconn_and_brings_p99_back(tmp_path, daemon_factory, root_only):
    inference_port = launcher.free_ports(1)[0]
    with one_service(["inference", "--port", str(inference_port), "--run-dir", str(tmp_path / "stack"),
                      "--set", "max_batch_size=1", *launcher.PACED], f"http://127.0.0.1:{inference_port}/healthz"):
        capacity = CAPACITY
        # HAProxy's server starts with room for twice the SLO's worth of work (its latency is about
        # the requests in it over its capacity): 18 in flight wait 1.2 s, so the step breaks the SLO.
        start = round(2 * SLO_MS / 1e3 * capacity)
        with haproxy(tmp_path / "haproxy", inference_port, maxconn=start, queue_timeout_ms=QUEUE_TIMEOUT_MS) as hp:
            written = tmp_path / "discovered.toml"
            name = discovered(hp, written)
            d = daemon_factory(lambda port, work: daemon_table(port, work, ("http",)) + written.read_text())
            url = f"http://127.0.0.1:{hp.port}/generate"
            records, trace, done = [], [], threading.Event()
            print(f"capacity {capacity:.1f} req/s, maxconn {start}: load {HIGH_X * capacity:.1f} then "
                  f"{LOW_X * capacity:.1f} req/s")

            def load():
                asyncio.run(_load(url, [(HIGH_X * capacity, HIGH_S), (LOW_X * capacity, LOW_S)], records))
                done.set()

            threading.Thread(target=load, daemon=True).start()
            t0 = time.monotonic()
            while not done.is_set():
                trace.append((time.monotonic() - t0, int(hp.stat("be_app", "app")["slim"]),
                              d.status()["services"][name]["p99_s"]))
                time.sleep(1.0)
    print("t, show stat slim, slotune P99:", [(round(t), s, p and round(p * 1e3)) for t, s, p in trace])
    print("audit:", [(e["old"], e["new"], e["outcome"]) for e in d.audit() if e["outcome"] != "kept"])
    served = np.array([(sent - records[0][0], lat) for sent, lat, status in records if status == 200])
    late = served[(served[:, 0] > HIGH_S - 8) & (served[:, 0] < HIGH_S)][:, 1]
    early = served[served[:, 0] < 6][:, 1]
    low = [status for sent, _, status in records if sent - records[0][0] > HIGH_S + 1]
    print(f"client P99 first 6 s {np.quantile(early, .99) * 1e3:.0f} ms, last 8 s of the step "
          f"{np.quantile(late, .99) * 1e3:.0f} ms ({len(late)} answers), 503s "
          f"{sum(status == 503 for _, _, status in records)} of {len(records)}, after the drop "
          f"{low.count(503)} of {len(low)}")
    assert np.quantile(early, 0.99) > SLO_MS / 1e3, "the step never pushed P99 over the SLO"
    step = [s for t, s, _ in trace if t < HIGH_S]
    after = [s for t, s, _ in trace if t >= HIGH_S]
    # at least as far as its largest cut (x0.5, rounded up) takes it in one window
    assert min(step) <= math.ceil(start / 2), f"the throttle never lowered HAProxy's maxconn: {step}"
    # the throttle gives the limit back, x1.1 or +1 a window while it is not binding with the queue under
    # half its budget: above where the step left it, so above the step's lowest too (a rollback inside the
    # step can also lift it above its lowest: 19 -> 37 in one run, which showed no raise after the drop)
    # or, where the first window after the drop still read the step's P99 and cut once more (33 -> 18,
    # then raised to 32 in the 12 s in a clean-clone CI run on 2026-12-06), well above that cut
    lowest = min(after)
    assert max(after) > step[-1] or max(after[after.index(lowest):]) >= 1.25 * lowest, \
        f"maxconn not raised again after the load dropped (from {step[-1]}): {after}"
    assert max(after) <= start, f"the throttle raised maxconn above the {start} HAProxy started with: {after}"
    pushed = [e for e in d.audit() if e["outcome"] == "pushed"]
    assert pushed and all(e["setting"] == "concurrency_limit" and 1 <= e["new"] <= start for e in pushed)
    # The throttle steers the P99 to its objective, so late in the step it settles at the SLO
    # (600.9 ms against 600 in one run on a busy host): back to it within 20 %, and far
    # below where the step had pushed it. Its additive increase probes a connection a
    # second past the SLO before it cuts, and sees each P99 an interval late: on a slow
    # host one connection is 35-45 ms of P99 (in a clean-clone CI run maxconn crept
    # 12 -> 14 with P99 at 0.64 s, and the late P99 read 661 ms, 1.1 x the SLO). Judged
    # second by second, the median of the last 8 s: one second's spike (771 ms in a
    # clean-clone CI run on 2026-12-05, at maxconn 28 with P99 at 431 ms the seconds
    # before and after; the daemon rolled that probe back) read 733 ms over the 8 s.
    late_p99 = [np.quantile(lat, 0.99) for t in range(int(HIGH_S) - 8, int(HIGH_S))
                if len(lat := served[(served[:, 0] >= t) & (served[:, 0] < t + 1)][:, 1])]
    assert np.median(late_p99) <= 1.2 * SLO_MS / 1e3, f"P99 not back to the SLO late in the step: {late_p99}"
    assert np.quantile(late, 0.99) <= 0.75 * np.quantile(early, 0.99), "P99 did not come down"
