"""What attribution reads out of a service's windows, each worked out once and kept
with the windows it describes (Window.derived: a Window never changes once built), so
that each second reads only the windows added since the last (daemon/model/columns.py):
a span's merged Window and its Stats (median, P99, cause readings, arrivals, answers), which
request timing a span is read from, the baseline's spans, and the jitter regression's
rows. daemon/attribution/explain.py is the method that judges them."""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from itertools import groupby
from typing import Any, Sequence

from slotune.attribution import causes
from slotune.model.columns import column, continued, handed
from slotune.model.histogram import add_into
from slotune.model.window import Window, merged_latency, merged_tokens

TOKENS = {"ttft": "TTFT", "tpot": "TPOT"}   # the token timings explained beside the latency, as users name them
SAME_REQUESTS = 0.8       # the kernel's request count within this of the service's own: same requests


def merge(windows: Sequence[Window]) -> Window:
    """One Window spanning several: histograms and counters summed, gauges averaged
    (a span of one window is that window)."""
    if len(windows) == 1:
        return windows[0]
    first, last = windows[0], windows[-1]
    histograms: dict = {}
    counters: dict = {}
    gauges: dict = {}
    for w in windows:
        for key, h in w.histograms.items():
            add_into(histograms, key, h)
        for key, v in w.counters.items():
            counters[key] = counters.get(key, 0.0) + v
        for key, v in w.gauges.items():
            gauges.setdefault(key, []).append(v)
    return Window(first.service, first.start, last.end, last.slo_p99_s, latency=merged_latency(list(windows)),
                  latency_source=last.latency_source, errors=sum(w.errors for w in windows),
                  rejected=sum(w.rejected for w in windows), histograms=histograms, counters=counters,
                  gauges={k: sum(v) / len(v) for k, v in gauges.items()}, slo_ttft_s=last.slo_ttft_s,
                  slo_tpot_s=last.slo_tpot_s, ttft=merged_tokens(list(windows), "ttft"),
                  tpot=merged_tokens(list(windows), "tpot"))


def timing_source(windows: Sequence[Window]) -> str:
    """Which request timing attribution reads over these windows: the kernel's
    ("ebpf") where it timed the service's requests, whose log-linear buckets
    resolve ±4.5 % at any latency, else the service's own ("service"; Prometheus'
    default buckets put 10–25 ms in one bucket, where every request slowed by
    4 ms leaves the interpolated P50 and P99 where they were). The kernel must
    have seen about as many requests as the service counted, not only its
    metrics scrapes (a TLS service's requests are encrypted, its /metrics is not);
    counted over all the windows, as a scrape and a map read never split one
    second the same way."""
    kernel = sum(timed_column(windows, "ebpf"))
    own = sum(timed_column(windows, "service"))
    return "ebpf" if kernel and kernel >= SAME_REQUESTS * own else "service"


def request_timing(w: Window, source: str):
    """The window's request-timing histogram from `source` (or its "ttft" or "tpot"), or None."""
    if source in TOKENS:
        return getattr(w, source)
    if source == "ebpf":
        return w.kernel_latency
    return w.latency if w.latency_source == source else None


@dataclass
class Stats:
    """What attribution reads from one span: its median, its P99, every cause, the
    requests that arrived per second (_arrivals), those answered (_answered), those left
    waiting (_queued) and the service's own in-flight gauge, if it has one."""
    p50: float
    p99: float
    readings: dict[str, causes.Reading]
    offered_rps: float = 0.0
    answered_rps: float = 0.0
    queued_rps: float = 0.0
    in_flight: float | None = None


# What attribution works out of a window is kept in its Window.derived (a Window never
# changes once built): (id of a span's last window, windows, source) -> that span's Stats,
# where the window is the span's first (windows leave the history oldest first, so its last
# lives as long); ("timed", source) -> requests timed; "ended" -> when it ended and its P99;
# ("jitter rows", source) -> the JitterRows of the horizon it was the newest window of;
# ("timed column", source), "ended column" -> the windows it was the newest of and each
# one's requests timed, or ended; ("spans", source, span_s) -> the baseline's chunks and
# their Stats, when it was the last window before the recent span.


def timed(w: Window, source: str) -> int:
    """How many requests the window's timing from `source` holds (0 without one)."""
    try:
        return w.derived[("timed", source)]
    except KeyError:
        h = request_timing(w, source)
        w.derived[("timed", source)] = count = h.count if h is not None else 0
        return count


def timed_column(ws: Sequence[Window], source: str) -> list[int]:
    """timed() of each of ws."""
    return column(ws, ("timed column", source), lambda w: timed(w, source))


def ended(w: Window) -> tuple[float, float | None]:
    """When the window ended, to the ms (how two services' windows are matched), and its
    latency's P99 (None when it answered nothing)."""
    known = w.derived
    if "ended" not in known:
        known["ended"] = (round(w.end, 3), w.p(0.99) if w.requests else None)
    return known["ended"]


def _arrivals(w: Window, source: str) -> float:
    """Requests that came in the window. Read from the kernel's request timing ("ebpf"),
    those it saw read, answered or not yet: a stalled server's load counts as it comes,
    and a backlog answered at once is no surge. Else those answered and refused."""
    return w.kernel_arrived if source == "ebpf" else w.requests + w.rejected


def _answered(w: Window, source: str) -> float:
    """Requests answered in the window, refusals among them: those the kernel timed
    ("ebpf"), else those the service counted."""
    if source == "ebpf":
        h = w.kernel_latency
        return float(h.count) if h is not None else 0.0
    return w.requests + w.rejected


def _queued(ws: Sequence[Window], span: Window, source: str) -> float:
    """Requests per second that came and were left waiting: the kernel's arrivals beyond
    its answers ("ebpf"), else the rise of the service's own in-flight gauge from the
    span's first window to its last (the service counts a request only once answered)."""
    if source == "ebpf":
        return (_arrivals(span, source) - _answered(span, source)) / span.seconds
    first, last = causes.in_flight(ws[0]), causes.in_flight(ws[-1])
    if first is None or last is None or ws[-1].end <= ws[0].end:
        return 0.0
    return (last - first) / (ws[-1].end - ws[0].end)


def stats(ws: Sequence[Window], source: str) -> Stats:
    """Stats of windows merged; remembered while the windows live."""
    known = ws[0].derived
    key = (id(ws[-1]), len(ws), source)
    if key in known:
        return known[key]
    span = merge(ws)
    timing = request_timing(span, source)
    p50, p99 = timing.quantiles((0.5, 0.99)) if timing is not None else (math.nan, math.nan)
    value = Stats(p50, p99, causes.read_all(span, source if source in TOKENS else "latency"),
                  _arrivals(span, source) / span.seconds, _answered(span, source) / span.seconds,
                  _queued(ws, span, source), causes.in_flight(span))
    known[key] = value
    return value


def _chunks(windows: list[Window], span_s: float) -> list[list[Window]]:
    """Consecutive windows grouped by end time into spans of span_s (stable from one call to the next)."""
    return [list(span) for _, span in groupby(windows, lambda w: math.floor(w.end / span_s))]


def baseline_spans(older: list[Window], source: str, span_s: float) -> list[Stats]:
    """stats() of each of older's _chunks, spans of span_s: the baseline attribution
    compares a recent span with. The chunks are kept with older's last window and
    handed to the next call (its older windows are these, less some at the front, and
    more at the back), which looks up again only the spans whose windows changed."""
    if not older:
        return []
    key = ("spans", source, span_s)
    kept = handed(older, key)
    chunks = _follow_chunks(kept[0], older, span_s) if kept else None
    if chunks is None:
        chunks = _chunks(older, span_s)
        read = [stats(c, source) for c in chunks]
    else:   # a chunk kept as it was is the same list (alive in `kept`: its id is its own)
        known = {id(c): st for c, st in zip(*kept)}
        read = [known.get(id(c)) or stats(c, source) for c in chunks]
    older[-1].derived[key] = (chunks, read)
    return read


def _follow_chunks(kept: list[list[Window]], older: list[Window], span_s: float) -> list[list[Window]] | None:
    """older's _chunks from the chunks of an earlier older (None: older does not continue it).
    Chunks whose windows are unchanged are the same list objects."""
    flat = [w for c in kept for w in c]
    last = next((i for i in range(len(older) - 1, -1, -1) if older[i] is flat[-1]), None)
    if last is None or last + 1 > len(flat) or not all(map(operator.is_, flat[len(flat) - last - 1:],
                                                              older[:last + 1])):
        return None
    gone = len(flat) - last - 1                  # windows that left at the front
    chunks = list(kept)
    while chunks and gone >= len(chunks[0]):
        gone -= len(chunks.pop(0))
    if gone:
        chunks[0] = chunks[0][gone:]
    for w in older[last + 1:]:
        if chunks and math.floor(chunks[-1][0].end / span_s) == math.floor(w.end / span_s):
            chunks[-1] = chunks[-1] + [w]
        else:
            chunks.append([w])
    return chunks


class JitterRows:
    """The jitter regression's rows over a run of windows, oldest first: each window's P99
    and cause readings (0.0 where it has none), the columns in the order the causes first
    appear. Kept with the run's newest window (Window.derived) and handed on to the next
    one's call, which drops the windows gone from the horizon and reads only the new ones."""

    def __init__(self, source: str):
        self.source = source
        self.windows: list[Window] = []
        self.p99: list[float] = []
        self.named: list[tuple[str, ...]] = []          # each window's causes, as its readings list them
        self.columns: dict[str, list[float]] = {}       # cause -> its reading in each window
        self.read_in: dict[str, int] = {}               # cause -> how many of the windows read it

    def follow(self, ws: Sequence[Window]) -> bool:
        """Become the rows of ws, if ws continues the windows held (False: start afresh)."""
        first = continued(self.windows, ws)
        if first is None:
            return False
        held = len(self.windows) - first
        for names in self.named[:first]:
            for cause in names:
                self.read_in[cause] -= 1
                if not self.read_in[cause]:
                    del self.read_in[cause], self.columns[cause]
        rows: list[list[Any]] = [self.windows, self.p99, self.named, *self.columns.values()]
        for row in rows:
            del row[:first]
        for w in ws[held:]:
            self.add(w)
        return True

    def add(self, w: Window) -> None:
        read, n = stats([w], self.source), len(self.windows)
        for values in self.columns.values():
            values.append(0.0)
        for cause, r in read.readings.items():
            if cause not in self.columns:
                self.columns[cause] = [0.0] * (n + 1)
            self.columns[cause][n] = r.value_s
            self.read_in[cause] = self.read_in.get(cause, 0) + 1
        self.windows.append(w)
        self.p99.append(read.p99)
        self.named.append(tuple(read.readings))

    def in_order(self) -> dict[str, list[float]]:
        """The columns, each cause where a window first names it."""
        order: dict[str, list[float]] = {}
        for names in self.named:
            if len(order) == len(self.columns):
                break
            for cause in names:
                if cause not in order:
                    order[cause] = self.columns[cause]
        return order


def jitter_rows(ws: Sequence[Window], source: str) -> JitterRows:
    """The rows of ws, from those kept with one of its ROWS_KEPT newest windows (the last
    call's newest: the daemon explains every RECENT_S), else read afresh."""
    key = ("jitter rows", source)
    rows = handed(ws, key)
    if rows is None or not rows.follow(ws):
        rows = JitterRows(source)
        for w in ws:
            rows.add(w)
    if ws:
        ws[-1].derived[key] = rows
    return rows
