"""Entries the shared BPF maps lost because they were full: the kernel's own
refused inserts (bpf/common.h map_full) plus the daemon's refused inserts into
`watched`, cumulative per map, exported as slotune_bpf_map_full_total{map} and
said once per map in the log, with the size and the key that raises it."""
from __future__ import annotations

import logging
import threading

from prometheus_client.core import CounterMetricFamily

from daemon.collectors.kernel.program import MAP_ENTRIES, MAP_ENTRIES_RANGE

log = logging.getLogger(__name__)

CONFIG_KEY = "daemon.bpf_map_entries"
EFFECT = {"hists": "histogram buckets (and their sums) are lost, so percentiles and means read low exactly "
                   "when new tail slots appear",
          "counts": "counters stop counting new series",
          "watched": "new tasks of the services go unwatched, so their events are not counted"}


class MapFull:
    """A prometheus_client collector (KernelCollector.metric_families()); the kernel
    collector feeds it with kernel() each interval and user() on each refused insert."""

    def __init__(self, entries: dict[str, int]):
        self.entries = entries
        self._lock = threading.Lock()
        self._kernel = dict.fromkeys(MAP_ENTRIES, 0)
        self._user = dict.fromkeys(MAP_ENTRIES, 0)
        self._said: set[str] = set()

    def kernel(self, refused: dict[str, int]) -> None:
        """The kernel's cumulative refused inserts per map."""
        with self._lock:
            self._kernel.update(refused)
        self._say()

    def user(self, name: str) -> None:
        """One insert from user space into map `name` was refused."""
        with self._lock:
            self._user[name] += 1
        self._say()

    def totals(self) -> dict[str, int]:
        with self._lock:
            return {name: self._kernel[name] + self._user[name] for name in MAP_ENTRIES}

    def _say(self) -> None:
        totals = self.totals()
        with self._lock:
            first = [name for name, n in totals.items() if n and name not in self._said]
            self._said.update(first)
        for name in first:
            log.warning("BPF map %s is full (%d entries) and drops new entries: %s. Raise %s.%s "
                        '(e.g. to %d) and restart slotune; slotune_bpf_map_full_total{map="%s"} counts them',
                        name, self.entries[name], EFFECT[name], CONFIG_KEY, name,
                        min(self.entries[name] * 2, MAP_ENTRIES_RANGE[1]), name)

    def collect(self):
        fam = CounterMetricFamily("slotune_bpf_map_full_total",
                                  "Entries a full BPF map dropped (inserts refused); raise daemon.bpf_map_entries",
                                  labels=["map"])
        for name, n in self.totals().items():
            fam.add_metric([name], float(n))
        yield fam
