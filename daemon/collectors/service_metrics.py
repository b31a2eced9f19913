"""Reads a service's own metrics each interval (Prometheus text, or nginx's
stub_status page) and turns them into deltas: every histogram becomes a
BucketHistogram, every counter a delta and every gauge a last value, keyed
(family, "label=value,..."; a counter by its _total name), for the families the
service's profile reads only (daemon/profiles), handed on as the profile's signals.
A service's answer is untrusted: a bad one costs that service its sample, never
another's. Reading one raises ValueError and nothing else, whatever it holds."""
from __future__ import annotations

import functools
import http.client
import logging
import math
import re
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Callable, Iterable

from slotune.collectors.client_body import Known, Meaning, Shape, sample_meaning
from slotune.collectors.exposition import client_form, families
from slotune.host.http_exchange import TooLarge, exchange
from slotune.model.sample import Key, Sample
from slotune.model.histogram import BucketHistogram
from slotune.model.service import ServiceSpec
from slotune import profiles

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 4 << 20
MAX_SERIES = 2000          # kept per service, counted as Prometheus does: one per histogram bucket
NAMES_REMEMBERED = 4096    # per service, whether a family name is one it reads
SCRAPERS = 16              # services read at once
READ_WAIT_S = 1.0          # a tick waits this long for the reads of services not late
# A failing service is read again after FIRST_BACKOFF_S, doubling to MAX_BACKOFF_S: one that times
# out costs a tick its deadline at most once in 30 s, and one that comes back is read within 30 s.
FIRST_BACKOFF_S, MAX_BACKOFF_S = 1.0, 30.0
# A histogram's cumulative bucket count is at most MAX_COUNT: past 2**53 a float no longer
# holds every whole number, so a delta between two reads is no count (a service answering a
# million requests a second takes 285 years to get there). Any other number read (a sum, a
# counter, a gauge) is at most MAX_VALUE in size: past any real total in any unit, and a
# billion of them added up stay finite, so no arithmetic on them overflows.
MAX_COUNT = 2 ** 53
MAX_VALUE = 1e100
# stub_status's lines -> the names nginx-prometheus-exporter gives them
STUB_STATUS = (
    (r"Active connections:\s*(\d+)", (("nginx_connections_active", "gauge"),)),
    (r"server accepts handled requests\s+(\d+)\s+(\d+)\s+(\d+)",
     (("nginx_connections_accepted_total", "counter"), ("nginx_connections_handled_total", "counter"),
      ("nginx_http_requests_total", "counter"))),
    (r"Reading:\s*(\d+)\s+Writing:\s*(\d+)\s+Waiting:\s*(\d+)",
     (("nginx_connections_reading", "gauge"), ("nginx_connections_writing", "gauge"),
      ("nginx_connections_waiting", "gauge"))),
)

Parsed = tuple[dict[Key, BucketHistogram], dict[Key, float], dict[Key, float]]


def parse(text: str, wanted: Callable[[str], bool] = lambda name: True, known: Known | None = None) -> Parsed:
    """Cumulative histograms, counters (monotonic totals) and gauges of the wanted
    families from exposition text; ValueError for text that is malformed, or a histogram
    no service could count (_histogram). Counters and gauges that are not finite, or larger
    than MAX_VALUE, are left out (a NaN gauge is valid, and useless). `known` (kept by
    the caller from one scrape to the next, for one service and one `wanted`) remembers
    the last body in the client libraries' form (client_body.py)."""
    known = Known() if known is None else known
    read: Iterable[tuple[Meaning | None, float]] | None = known.shape.read(text) if known.shape is not None else None
    if read is None and client_form(text):
        known.shape = Shape.of(text, wanted, known.meanings)
        read = known.shape.read(text)
    if read is None:     # not in the client libraries' form: the full parser
        read = ((sample_meaning(f.type, f.name, s.name, s.labels, wanted), s.value)
                for f in families(text, wanted) for s in f.samples)
    buckets: dict[Key, list[tuple[float, float]]] = {}
    sums: dict[Key, float] = {}
    counters: dict[Key, float] = {}
    gauges: dict[Key, float] = {}
    for meaning, value in read:
        if meaning is None:
            continue
        kind, key, le = meaning
        value = _real(value)
        if kind == "bucket":
            buckets.setdefault(key, []).append((le, value))
        elif kind == "sum":
            sums[key] = value
        elif not -MAX_VALUE <= value <= MAX_VALUE:
            continue
        elif kind == "counter":
            counters[key] = value     # by its _total name, which the parser gives even to Triton's
        else:
            gauges[key] = value
    hists = {key: _histogram(key, pairs, sums.get(key, 0.0)) for key, pairs in buckets.items()}
    return hists, counters, gauges


def _real(value: int | float) -> float:
    """A sample's value as a float: infinite for an integer past a float's range."""
    try:
        return float(value)
    except OverflowError:
        return math.inf


def _histogram(key: Key, pairs: list[tuple[float, float]], total: float) -> BucketHistogram:
    """The histogram of (le, cumulative count) pairs and its sum; ValueError for one no
    service could count: a cumulative count below 0, above MAX_COUNT or going down as le
    grows, or a sum below 0 or above MAX_VALUE."""
    within = all(0 <= count <= MAX_COUNT for _, count in pairs) and 0 <= total <= MAX_VALUE
    h = BucketHistogram.from_cumulative(pairs, total) if within else None
    if h is None or h.counts.min() < 0:
        raise ValueError(f"histogram {key[0]}{{{key[1]}}}: its cumulative bucket counts must be numbers from 0 "
                         f"to {MAX_COUNT} that never go down as le grows, and its sum a number from 0 to "
                         f"{MAX_VALUE:g}; read {len(pairs)} buckets, the first (le, count) {sorted(pairs)[:3]}, "
                         f"sum {total}"[:400])
    return h


def parse_stub_status(text: str) -> Parsed:
    """nginx's stub_status page as counters and gauges (those larger than MAX_VALUE left
    out); ValueError when it is not one."""
    counters: dict[Key, float] = {}
    gauges: dict[Key, float] = {}
    for pattern, names in STUB_STATUS:
        m = re.search(pattern, text)
        if m is None:
            raise ValueError(f"not a stub_status page: no line matching {pattern!r}")
        for (name, kind), value in zip(names, map(float, m.groups())):
            if value <= MAX_VALUE:
                (counters if kind == "counter" else gauges)[(name, "")] = value
    return {}, counters, gauges


def read_exposition(text: str, exposition: str, wanted: Callable[[str], bool] = lambda name: True,
                    known: Known | None = None) -> Parsed:
    """The series of a service's answer, read as its profile says it is written."""
    if exposition == "stub_status":
        return parse_stub_status(text)
    return parse(text, wanted, known)


def capped(parsed: Parsed, max_series: int) -> tuple[Parsed, int]:
    """The first series, in exposition order, up to max_series; and how many there were."""
    kept: list[dict] = []
    total = 0
    for table in parsed:
        kept.append({})
        for key, value in table.items():
            n = len(value.bounds_s) if isinstance(value, BucketHistogram) else 1
            total += n
            if total <= max_series:
                kept[-1][key] = value
    hists, counters, gauges = kept
    return (hists, counters, gauges), total


def _reads(own: tuple[str, ...], profile: profiles.Profile, name: str) -> bool:
    """Whether a family (or counter sample) is one slotune reads of a service: one it
    names itself (latency_metric, ...) or one of its profile's signals."""
    return name in own or profile.wants(name)


def parse_body(body: bytes, exposition: str, wanted: Callable[[str], bool], known: Known) -> Parsed | ScrapeError:
    """A body's wanted series, or why it cannot be read."""
    try:
        text = body.decode()
    except UnicodeDecodeError as exc:
        return ScrapeError("is not UTF-8", str(exc))
    try:
        return read_exposition(text, exposition, wanted, known)
    except ValueError as exc:
        return ScrapeError("does not parse", " ".join(str(exc).split())[:200])


class ScrapeError(Exception):
    """What was wrong with one service's /metrics this interval, in words (`kind`), and the detail."""

    def __init__(self, kind: str, detail: str):
        super().__init__(detail)
        self.kind = kind


def fetch(url: str, timeout_s: float, max_bytes: int) -> bytes:
    """GET url's body. Connecting, the headers and the body get timeout_s together, so a
    trickle ends there; a body over max_bytes is refused. Follows no redirect, uses no proxy."""
    try:
        status, _, body = exchange(url, headers={"Accept": "text/plain"}, timeout_s=timeout_s,
                                   max_bytes=max_bytes)
    except TooLarge as exc:
        raise ScrapeError("is too large", str(exc)) from None
    if status != 200:
        raise ScrapeError("cannot be read", f"HTTP {status}")
    return body


class ServiceMetricsCollector:
    """One scrape per service per interval, all at once. A tick waits up to READ_WAIT_S
    for the reads of the services that are not late; a service is late from a read that
    failed or outlasted that wait until one that did not, and its reads go on beside the
    ticks, each taken by the first tick after it ends: a trickle or a body slow to parse
    costs a tick that wait once, not each time it is read. A service that does not
    answer, or answers with what cannot be read (or with what makes anything here
    raise), is reported once per kind of failure (and again when it comes back), yields
    no sample and is read again after a back-off (1 s doubling to 30 s, from when it was
    asked). The first good read after a failure only sets the starting point again. A
    read runs on a thread and touches nothing shared."""
    name = "service_metrics"

    def __init__(self, timeout_s: float = 0.8):
        self.urls: dict[str, str] = {}      # service -> its metrics_url
        self.own: dict[str, tuple[str, ...]] = {}   # service -> the families it names itself (latency_metric, ...)
        self.profile: dict[str, profiles.Profile] = {}
        self.timeout_s = timeout_s
        self.previous: dict[str, tuple[dict, dict]] = {}
        self.wanted: dict[str, Callable[[str], bool]] = {}    # service -> whether it reads a family name
        self.last: dict[str, tuple[bytes, Parsed | ScrapeError]] = {}   # service -> its last body, as read
        self.known: dict[str, Known] = {}         # service -> its last body in client form (parse's `known`)
        self.failing: dict[str, set[str]] = {}    # service -> kinds of failure reported
        self.capped: set[str] = set()             # services reported over MAX_SERIES
        self.retry: dict[str, tuple[float, float]] = {}   # failing service -> (read again at, its back-off)
        self.clock = time.monotonic
        self.read_wait_s = READ_WAIT_S
        self.reading: dict[str, tuple[str, float, Future]] = {}   # service -> (url, asked at, its read)
        self.late: set[str] = set()               # services whose last read failed or outlasted read_wait_s
        self.pool = ThreadPoolExecutor(SCRAPERS, thread_name_prefix="service-metrics")

    exports_samples = False    # the services export these series themselves

    @property
    def up(self) -> bool:
        return True

    def parts(self) -> dict[str, bool]:
        return {}

    def metric_families(self):
        return ()

    def start(self, services: list[ServiceSpec]) -> None:
        self.update_services(services)

    def update_services(self, services: list[ServiceSpec]) -> None:
        def reading(name):
            return self.urls.get(name), self.own.get(name), self.profile.get(name)
        before = {name: reading(name) for name in self.urls}
        read = [s for s in services if s.metrics_url and profiles.get(s.profile).exposition]
        self.urls = {s.name: s.metrics_url for s in read}
        self.profile = {s.name: profiles.get(s.profile) for s in read}
        self.own = {s.name: s.own_metrics() for s in read}
        self.wanted = {name: functools.lru_cache(NAMES_REMEMBERED)(functools.partial(_reads, self.own[name], profile))
                       for name, profile in self.profile.items()}
        # A service read from elsewhere, or for other families, starts over from one read.
        same = {name for name in self.urls if before.get(name) == reading(name)}
        self.previous = {name: p for name, p in self.previous.items() if name in same}
        self.last = {name: last for name, last in self.last.items() if name in same}
        self.known = {name: known for name, known in self.known.items() if name in same}
        self.retry = {name: r for name, r in self.retry.items() if name in same}
        self.reading = {name: r for name, r in self.reading.items() if name in same}
        self.late &= same

    def read(self, url: str, last: tuple[bytes, Parsed | ScrapeError] | None, exposition: str,
             wanted: Callable[[str], bool], known: Known) -> tuple[bytes | None, Parsed | ScrapeError, float]:
        """(the body, the service's wanted series or what was wrong, seconds taken): returned,
        so one bad service stops nothing else, whatever it makes happen here. last is the
        service's last (body, answer): the same bytes read the same, a service at rest is
        not parsed again."""
        t0 = time.monotonic()
        try:
            body, got = self._read(url, last, exposition, wanted, known)
        except Exception as exc:     # a fault nobody foresaw, fetching or parsing, is still only this service's
            body, got = None, ScrapeError("could not be read", f"{type(exc).__name__}: {exc}"[:200])
        return body, got, time.monotonic() - t0

    def _read(self, url, last, exposition, wanted, known) -> tuple[bytes | None, Parsed | ScrapeError]:
        try:
            body = fetch(url, self.timeout_s, MAX_BODY_BYTES)
        except ScrapeError as exc:
            return None, exc
        except TimeoutError:
            return None, ScrapeError(f"took longer than {self.timeout_s:g} s", "the answer was not complete in time")
        except (OSError, http.client.HTTPException, ValueError) as exc:
            return None, ScrapeError("cannot be read", str(exc) or type(exc).__name__)
        if last is not None and last[0] == body:
            return body, last[1]
        return body, parse_body(body, exposition, wanted, known)

    def _report(self, service: str, url: str, got: Parsed | ScrapeError) -> None:
        if isinstance(got, ScrapeError):
            if got.kind not in self.failing.setdefault(service, set()):
                log.warning("service %s: its metrics at %s %s (%s); no sample from it until it answers "
                            "well, the other services go on", service, url, got.kind, got)
                self.failing[service].add(got.kind)
        elif self.failing.pop(service, None):
            log.info("service %s: metrics at %s answer again", service, url)

    def _cap(self, service: str, parsed: Parsed) -> Parsed:
        parsed, total = capped(parsed, MAX_SERIES)
        if total > MAX_SERIES and service not in self.capped:
            log.warning("service %s: %d series in the families slotune reads, over the %d kept per service; "
                        "the first %d are kept: drop a label with many values from them",
                        service, total, MAX_SERIES, MAX_SERIES)
            self.capped.add(service)
        return parsed

    def collect(self, start: float, end: float) -> list[Sample]:
        now = self.clock()
        for name, url in self.urls.items():
            if name not in self.reading and now >= self.retry.get(name, (0.0, 0.0))[0]:
                known = self.known.setdefault(name, Known())
                self.reading[name] = url, now, self.pool.submit(
                    self.read, url, self.last.get(name), self.profile[name].exposition, self.wanted[name], known)
        wait([f for name, (*_, f) in self.reading.items() if name not in self.late], timeout=self.read_wait_s)
        answers = []     # (service, url, asked at, answer) of each read that has ended
        for name, (url, at, future) in list(self.reading.items()):
            if not future.done():
                self.late.add(name)
                continue
            del self.reading[name]
            body, got, took = future.result()
            if body is not None:
                self.last[name] = (body, got)
            (self.late.add if took > self.read_wait_s else self.late.discard)(name)
            answers.append((name, url, at, got))
        return self._samples(start, end, answers)

    def _samples(self, start: float, end: float, answers) -> list[Sample]:
        out = []
        for service, url, at, got in answers:
            if not isinstance(got, ScrapeError):
                try:
                    sample = self._delta(service, start, end, got)
                except Exception as exc:
                    got = ScrapeError("could not be turned into signals", f"{type(exc).__name__}: {exc}"[:200])
            self._report(service, url, got)
            if isinstance(got, ScrapeError):
                self.late.add(service)
                self.previous.pop(service, None)
                backoff = min(self.retry.get(service, (0.0, FIRST_BACKOFF_S / 2))[1] * 2, MAX_BACKOFF_S)
                self.retry[service] = (at + backoff, backoff)   # from when it was asked
                continue
            self.retry.pop(service, None)
            if sample is not None:
                out.append(sample)
        return out

    def _delta(self, service: str, start: float, end: float, parsed: Parsed) -> Sample | None:
        """The change since the last read, as the service's sample; None for its first read."""
        hists, counters, gauges = self._cap(service, parsed)
        before = self.previous.get(service)
        self.previous[service] = (hists, counters)
        if before is None:
            return None   # the first read only sets the starting point
        prev_h, prev_c = before
        hists = {k: h.minus(prev_h[k]) if k in prev_h else h for k, h in hists.items()}
        counters = {k: v - prev_c.get(k, 0.0) if v >= prev_c.get(k, 0.0) else v for k, v in counters.items()}
        return self._signals(service, start, end, hists, counters, gauges)

    def _signals(self, service: str, start: float, end: float, hists, counters, gauges) -> Sample:
        """The interval's deltas as the profile's signals, beside the families the service names itself."""
        own = self.own.get(service, ())
        sample = Sample(service, self.name, start, end,
                        *self.profile[service].signals_of(hists, counters, gauges))
        for table, out in ((hists, sample.histograms), (counters, sample.counters), (gauges, sample.gauges)):
            out.update({k: v for k, v in table.items() if k[0] in own})
        return sample

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
