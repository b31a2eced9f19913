"""Attribution keeps what it works out of each window with the window
(Window.derived), so a window's statistics are computed once, not every second,
and the jitter regression's rows and the baseline's spans are handed from one
call to the next, which adds the new windows and drops the old: explain_all over a
sliding history, window objects reused from call to call (every second, with
seconds skipped and seconds without requests), must give every field, to the
bit, that it gives on fresh copies of the same windows, where nothing was kept.
And what is kept goes with the history: a value a late call left behind does not
keep the windows of its call alive once its own window has left the history."""
import dataclasses
import gc
import math
import random
import weakref

import numpy as np

from slotune.attribution import spans
from slotune.attribution.explain import explain_all
from slotune.model.columns import History
from slotune.model.histogram import BucketHistogram, Histogram
from slotune.model.window import EBPF_LATENCY, Window

BOUNDS = (.005, .01, .025, .05, .075, .1, .15, .2, .3, .5, .75, 1, 1.5, 2, 3, 5, 10, math.inf)
CALLS = {"gateway": ("inference", "tools"), "inference": (), "tools": ()}
HORIZON_S, RECENT_S = 60.0, 2.0


def service_histogram(rng, mean_s: float, n: int) -> BucketHistogram:
    values = [rng.expovariate(1 / mean_s) for _ in range(n)]
    counts = np.zeros(len(BOUNDS))
    for v in values:
        counts[next(i for i, b in enumerate(BOUNDS) if v <= b)] += 1
    return BucketHistogram(BOUNDS, counts, float(sum(values)))


def kernel_histogram(rng, mean_ns: float, n: int) -> Histogram:
    return Histogram.from_values([rng.expovariate(1 / mean_ns) for _ in range(n)])


def window(rng, service: str, t: float) -> Window:
    """One second of a service; from t = 70 the gateway's run queue and the inference
    server's queue slow down, so the explanations name causes, not only noise. The tools
    service answers nothing every 11th second."""
    fault = t >= 70
    streams = service == "inference"
    idle = service == "tools" and t % 11 == 0
    w = Window(service, t, t + 1.0, 0.5,
               latency=None if idle else service_histogram(rng, 0.04 * (3 if fault else 1), 40), latency_source="service",
               slo_ttft_s=0.2 if streams else 0.0, slo_tpot_s=0.05 if streams else 0.0,
               ttft=service_histogram(rng, 0.02 * (4 if fault else 1), 40) if streams else None,
               tpot=service_histogram(rng, 0.005, 200) if streams else None)
    w.histograms[("runqueue_wait", "")] = kernel_histogram(rng, 2e4 * (50 if fault and service == "gateway" else 1), 60)
    w.histograms[("offcpu", "sleep")] = kernel_histogram(rng, 1e6, 20)
    w.histograms[("tcp_rtt", "8000")] = kernel_histogram(rng, 1e5, 20)
    if service == "tools" and not idle:      # timed by the kernel too: the ebpf timing source
        w.histograms[EBPF_LATENCY] = kernel_histogram(rng, 4e7, 45)
    if service == "gateway":
        for tool in ("search", "calc"):
            w.histograms[("gateway_tool_duration_seconds", f"tool={tool}")] = service_histogram(rng, 0.01, 10)
    if streams:
        w.histograms[("inference_queue_wait_seconds", "")] = service_histogram(rng, 0.01 * (5 if fault else 1), 40)
        w.histograms[("inference_batch_compute_seconds", "")] = service_histogram(rng, 0.01, 10)
        w.gauges[("inference_num_requests_waiting", "")] = 12.0 if fault else 2.0
    return w


def fresh(ws):
    """The same windows as new objects, with nothing derived yet."""
    return [dataclasses.replace(w) for w in ws]


def fields(explanations) -> str:
    """Every field of every explanation (nested ones too), floats to the last bit."""
    return repr({name: dataclasses.asdict(e) for name, e in explanations.items()})


def test_explanations_from_kept_statistics_equal_a_fresh_recompute():
    rng = random.Random(21)
    history = {s: [] for s in CALLS}
    compared = named = followed = 0
    handed, chunks_kept, spans_followed = None, [], 0
    for t in range(90):
        for s in CALLS:
            history[s] = [w for w in history[s] if w.end > t - HORIZON_S] + [window(rng, s, float(t))]
        if t < 20 or t % 10 == 0 or 50 <= t < 56:   # seconds skipped; after 6, the rows are read afresh
            continue
        kept = explain_all({s: tuple(ws) for s, ws in history.items()}, CALLS, recent_s=RECENT_S,
                           horizon_s=HORIZON_S)
        rows = history["gateway"][-1].derived[("jitter rows", "service")]
        followed += rows is handed
        handed = rows
        chunks, _ = history["gateway"][-3].derived[("spans", "service", RECENT_S)]   # the last before the recent 2
        spans_followed += any(c is k for c in chunks[:-1] for k in chunks_kept)
        chunks_kept = chunks
        if t % 3:
            continue
        again = explain_all({s: tuple(ws) for s, ws in history.items()}, CALLS, recent_s=RECENT_S,
                            horizon_s=HORIZON_S)
        recomputed = explain_all({s: tuple(fresh(ws)) for s, ws in history.items()}, CALLS, recent_s=RECENT_S,
                                 horizon_s=HORIZON_S)
        assert fields(kept) == fields(recomputed) == fields(again), t
        assert history["gateway"][0].derived     # kept with the window, not recomputed each time
        compared += 1
        named += sum(bool(e.top_cause) for e in kept.values())
    assert compared >= 18 and named > 0 and followed > 40 and spans_followed > 40, \
        (compared, named, followed, spans_followed)


def test_the_timed_column_reads_only_the_windows_added_since(monkeypatch):
    """timing_source() over a horizon that slid on by two windows reads those two only, and
    one that does not continue the last (a window in it replaced) is read afresh, whole."""
    rng = random.Random(5)
    ws = [window(rng, "tools", float(t)) for t in range(40)]
    reads = []
    real = spans.timed
    monkeypatch.setattr(spans, "timed", lambda w, source: reads.append(w) or real(w, source))

    def counted(horizon) -> tuple[str, int, int]:
        reads.clear()
        source = spans.timing_source(horizon)
        kernel, own = (sum(real(w, s) for w in horizon) for s in ("ebpf", "service"))
        return source, len(reads), kernel + own

    assert counted(ws[:30])[1] == 60
    source, read, total = counted(ws[2:32])
    assert read == 4 and source == spans.timing_source(fresh(ws[2:32]))
    assert sum(spans.timed_column(ws[2:32], "ebpf")) + sum(spans.timed_column(ws[2:32], "service")) == total
    replaced = ws[4:30] + fresh(ws[30:31]) + ws[31:34]      # the kept column is found, on ws[31]
    assert counted(replaced)[1] == 2 * len(replaced)


def test_windows_gone_from_the_history_are_freed_though_a_late_call_left_a_kept_value():
    """Every 20 s the calls pause for 6 (a slow tick, a reload): what the last call kept,
    with its whole horizon, is left on a window the next call does not look at. Were it
    kept until that window is freed, and that window held by the next value left behind,
    no window would ever be freed (a plain deque: 3 x 400 alive at the end)."""
    rng = random.Random(11)
    kept = 50
    history = {s: History(maxlen=kept) for s in CALLS}
    alive = weakref.WeakSet()
    for t in range(400):
        for s, ws in history.items():
            w = window(rng, s, float(t))
            alive.add(w)
            ws.append(w)
        if t % 20 > 5 and t % 2 == 0:
            explain_all({s: tuple(ws) for s, ws in history.items()}, CALLS, recent_s=RECENT_S,
                        horizon_s=HORIZON_S, now=t + 1.0)
    gc.collect()
    # the history, and the horizon a value left behind on its oldest window still holds
    assert len(alive) <= len(CALLS) * (kept + HORIZON_S + 1), len(alive)
