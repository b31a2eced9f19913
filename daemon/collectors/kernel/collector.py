"""The kernel collector: finds the services' tasks, loads every probe family as
one BPF object, and each interval turns the kernel's cumulative maps into one
Sample of deltas per service. collect() never raises: a map it cannot read keeps
its last value (its deltas come with the next interval that reads it), each kind
of failure is logged once. Inserts a full map refused, the kernel's and its own
into `watched`, are counted in slotune_bpf_map_full_total{map}, the entries a full
LRU map evicted in slotune_bpf_map_evicted_total{map}; what each BPF
program costs, as the kernel counts it, in slotune_bpf_program_*{program}. A
program a service starts is watched as it execs (arrivals.py: a thread, which takes
the collector's lock in turn with the rescan). The daemon's rescan of /proc runs every
rescan_s while that thread runs (exec, fork and exit are caught in the kernel; a
port finder, the process list the GPU collector reads and late libraries wait for
it), every collect() without it. close() detaches everything and is idempotent."""
from __future__ import annotations

import ctypes
import logging
import os
import threading
import time

from slotune.model.sample import Sample
from slotune.collectors.kernel.arrivals import Arrivals
from slotune.collectors.kernel.evictions import Evictions
from slotune.collectors.kernel.families import SIGNAL_NAMES, make_families
from slotune.collectors.kernel.map_full import MapFull
from slotune.collectors.kernel.maps import U32, items
from slotune.collectors.kernel.program import HINT_SLOTS, MAP_ENTRIES, Program
from slotune.collectors.kernel.program_cost import ProgramCost, say_at_start
from slotune.model.histogram import Histogram
from slotune.model.service import ServiceSpec
from slotune.collectors.kernel.targeting import ServiceProcesses, Targeting, threads

log = logging.getLogger(__name__)

RESCAN_S = 5.0    # the daemon's rescan of /proc while the exec watch runs


class KernelCollector:
    """Collector protocol (daemon/collectors/base.py) over the bpf/ programs."""
    name = "kernel"

    def __init__(self, families: list[str] | None = None, map_entries: dict[str, int] | None = None,
                 rescan_s: float = 0.0):
        self.families = make_families(families)
        self.map_entries = {**MAP_ENTRIES, **(map_entries or {})}   # map name -> entries
        self.map_full = MapFull(self.map_entries)
        self.evictions = Evictions()
        self.program_cost = ProgramCost(lambda: program.fds() if (program := self.program) else {})
        self.family_of = {s.name: f for f in self.families for s in f.signals}   # signal -> family
        self.program: Program | None = None
        self.targeting: Targeting | None = None
        self.targets: dict[str, ServiceProcesses] = {}
        self.service_ids: dict[str, int] = {}      # stable for the collector's life
        self.last: tuple[dict, dict, dict] = ({}, {}, {})
        self.start_error = ""
        self.hinted: set[int] = set()             # watched_hint slots we set
        self.failed: set[str] = set()             # kinds of failure already logged
        self.lock = threading.RLock()             # the rescan and adopt() change `watched` in turn
        self.arrivals: Arrivals | None = None
        self.adopt_spent = 0.0                    # seconds adopt() matched since the last rescan
        self.rescan_s = rescan_s                  # least time between collect()'s rescans, with the exec watch
        self.scanned_at = -float("inf")           # time.monotonic() of the last rescan

    @property
    def up(self) -> bool:
        return self.program is not None

    exports_samples = True

    @property
    def attached(self) -> dict[str, bool]:
        """probe -> attached, for slotune_probe_attached."""
        return dict(self.program.attached) if self.program else {}

    def parts(self) -> dict[str, bool]:
        return self.attached

    def metric_families(self):
        return self.map_full, self.program_cost

    def start(self, services: list[ServiceSpec]) -> None:
        self.targeting = Targeting(services)   # bad declarations raise here, with the fix
        self._assign_ids(services)
        try:
            self.program = Program(self.families, self.map_entries)
        except Exception as exc:
            self.start_error = str(exc)
            log.error("kernel probes could not load (%s); run `slotune doctor` for the fix", exc)
            return
        self.program.attach_tracepoints()
        say_at_start()
        self.refresh()
        self.last = self._read(self.program)
        self.arrivals = self._try("exec watch start", None, Arrivals, self.program, self.adopt)

    def update_services(self, services: list[ServiceSpec]) -> None:
        with self.lock:
            if self.targeting is None:
                self.targeting, changed = Targeting(services), True
            else:
                changed = self.targeting.update_services(services)
            self._assign_ids(services)
            if self.program and changed:
                self.refresh()

    def _assign_ids(self, services: list[ServiceSpec]) -> None:
        for spec in services:
            self.service_ids.setdefault(spec.name, len(self.service_ids) + 1)

    def refresh(self) -> None:
        """Rescan the services' processes and bring the kernel maps up to date."""
        with self.lock:
            self._refresh()
            self.adopt_spent = 0.0
            self.scanned_at = time.monotonic()

    def _refresh(self) -> None:
        program, targeting = self.program, self.targeting
        if program is None or targeting is None:
            return      # not started, or closed
        self.targets = targeting.scan()
        wanted = {tid: self.service_ids[name] for name, procs in self.targets.items()
                  for tid in procs.tids}
        active = {self.service_ids[name] for name in self.targets}
        watched = program.table("watched")
        present = dict(items(watched))
        for tid, sid in wanted.items():
            if present.get(tid) != sid:
                try:
                    watched[U32(tid)] = U32(sid)
                except Exception:   # BCC raises bare Exception; in practice the map is full
                    self.map_full.user("watched")
        kept = set(wanted)
        for tid, sid in present.items():
            # Tasks the kernel added at fork stay while they live and their service exists.
            if tid not in wanted and (sid not in active or not _alive(tid)):
                try:
                    del watched[U32(tid)]
                except KeyError:
                    pass
            else:
                kept.add(tid)
        self._update_hints(program, kept)
        for family in program.families:
            self._try(f"{family.name} refresh", None, family.refresh, program, self.targets, self.service_ids)

    def adopt(self, pid: int) -> None:
        """A program an unwatched task just exec'd: if it is a service's, watch its
        threads now. Only the finders an exec already shows (command line, unit,
        cgroup, user): a port finder waits for the rescan. Matching here shares
        the rescan's time budget, so exec'ing command lines cannot hog the daemon."""
        with self.lock:
            program, targeting = self.program, self.targeting
            if (program is None or targeting is None or pid == targeting.own_pid
                    or self.adopt_spent > targeting.scan_budget_s):
                return
            t0 = time.perf_counter()
            names = [s.name for s in targeting.services if s.port is None and targeting.matches(pid, s, {})]
            self.adopt_spent += time.perf_counter() - t0
            if not names:
                return
            sid = self.service_ids[names[-1]]     # as in the rescan: the last service listed wins
            watched, hint = program.table("watched"), program.table("watched_hint")
            seen: set[int] = set()
            for _ in range(3):   # threads started meanwhile by one not yet watched (Go starts several at once)
                tids = threads(pid) - seen
                if not tids:
                    break
                for tid in tids:
                    try:
                        watched[U32(tid)] = U32(sid)
                    except Exception:   # BCC raises bare Exception; in practice the map is full
                        self.map_full.user("watched")
                    if tid % HINT_SLOTS not in self.hinted:
                        hint[ctypes.c_int(tid % HINT_SLOTS)] = U32(1)
                        self.hinted.add(tid % HINT_SLOTS)
                seen |= tids

    def _update_hints(self, program: Program, tids: set[int]) -> None:
        """Set the watched_hint slots of these tids, clear the ones no longer needed
        (slots of tasks forked and gone between two scans stay set: harmless)."""
        hint = program.table("watched_hint")
        slots = {tid % HINT_SLOTS for tid in tids}
        for slot in slots - self.hinted:
            hint[ctypes.c_int(slot)] = U32(1)
        for slot in self.hinted - slots:
            hint[ctypes.c_int(slot)] = U32(0)
        self.hinted = slots

    def collect(self, start: float, end: float) -> list[Sample]:
        program = self.program
        if program is None:
            return []
        now = self._read(program)
        samples = self._try("samples", [], self.samples, start, end, self.last, now)
        self.last = now
        self._try("map_full read", None, lambda: self.map_full.kernel(program.map_full()))
        self._try("evictions read", None, lambda: self.map_full.evicted(self.evictions.read(program)))
        if self.arrivals is None or time.monotonic() - self.scanned_at >= self.rescan_s:
            self._try("refresh", None, self.refresh)
        return samples

    def _read(self, program: Program) -> tuple[dict, dict, dict]:
        """Cumulative (hists, sums, counts); hists and sums are read as a pair (a
        histogram needs both), a part that cannot be read keeps its last value."""
        hists, sums, counts = self.last
        hists, sums = self._try("histograms read", (hists, sums), program.histograms)
        counts = self._try("counters read", counts, program.counters, self.service_ids.values())
        return hists, sums, counts

    def _try(self, kind: str, fallback, fn, *args):
        """fn(*args), or `fallback` when it raises: logged the first time for this kind."""
        try:
            return fn(*args)
        except Exception:
            if kind not in self.failed:
                self.failed.add(kind)
                log.exception("kernel collector: %s failed; the interval keeps what it could and the "
                              "collector goes on (said once)", kind)
            return fallback

    def samples(self, start: float, end: float, before, now) -> list[Sample]:
        names = {sid: name for name, sid in self.service_ids.items() if name in self.targets}
        out = {name: Sample(name, self.name, start, end) for name in names.values()}
        hists, sums, counts = now
        for key, counts_now in hists.items():
            sid, sig, label = key
            if sid not in names:
                continue
            cumulative = Histogram(counts_now, float(sums.get(key, 0)))
            earlier = before[0].get(key)
            prev = Histogram(earlier, float(before[1].get(key, 0))) if earlier is not None else Histogram()
            delta = cumulative.minus(prev)
            if delta.count:
                out[names[sid]].histograms[self.key(sig, label, names[sid])] = delta
        for key, value in counts.items():
            sid, sig, label = key
            if sid not in names:
                continue
            delta = value - before[2].get(key, 0)
            delta = value if delta < 0 else delta
            if delta:
                out[names[sid]].counters[self.key(sig, label, names[sid])] = float(delta)
        for name, procs in self.targets.items():
            out[name].gauges[("processes", "")] = float(len(procs.tgids))
        return list(out.values())

    def key(self, signal_id: int, label_id: int, service: str) -> tuple[str, str]:
        signal = SIGNAL_NAMES[signal_id]
        family = self.family_of.get(signal)
        return signal, family.label(signal, label_id, service) if family else ""

    def close(self) -> None:
        arrivals, self.arrivals = self.arrivals, None
        if arrivals is not None:
            arrivals.stop()
        with self.lock:
            program, self.program = self.program, None
        if program is not None:
            program.close()


def _alive(tid: int) -> bool:
    try:
        os.stat(f"/proc/{tid}")
        return True
    except OSError:
        return False
