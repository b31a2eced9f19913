"""Entries the BPF maps lost because they were full, cumulative per map and said
once per map in the log, with the size and the key that raises it: the inserts a
full map refused (the kernel's, bpf/common.h map_full, plus the daemon's own
into `watched`), exported as slotune_bpf_map_full_total{map}, and the entries the
families' LRU maps evicted to make room (evictions.py), exported as
slotune_bpf_map_evicted_total{map}."""
from __future__ import annotations

import logging
import threading

from prometheus_client.core import CounterMetricFamily

from slotune.collectors.kernel.program import EVICTING, FAMILY_MAPS, MAP_ENTRIES_RANGE, REFUSING

log = logging.getLogger(__name__)

CONFIG_KEY = "daemon.bpf_map_entries"
EFFECT = {"hists": "histogram buckets (and their sums) are lost, so percentiles and means read low exactly "
                   "when new tail slots appear",
          "counts": "counters stop counting new series",
          "watched": "new tasks of the services go unwatched, so their events are not counted",
          **{name: m.loses for name, m in FAMILY_MAPS.items()}}
# metric -> (what its map does when full, for the log line; the metric's help)
LOST = {"slotune_bpf_map_full_total":
        ("drops new entries", "Entries a full BPF map dropped (inserts refused); raise daemon.bpf_map_entries"),
        "slotune_bpf_map_evicted_total":
        ("evicts its least recently used entries",
         "Entries a full LRU BPF map evicted to make room; raise daemon.bpf_map_entries")}


class MapFull:
    """A prometheus_client collector (KernelCollector.metric_families()); the kernel
    collector feeds it with kernel() and evicted() each interval and user() on each
    refused insert."""

    def __init__(self, entries: dict[str, int]):
        self.entries = entries
        self._lock = threading.Lock()
        self._kernel = dict.fromkeys(REFUSING, 0)
        self._user = dict.fromkeys(REFUSING, 0)
        self._evicted = dict.fromkeys(EVICTING, 0)
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

    def evicted(self, evictions: dict[str, int]) -> None:
        """The LRU maps' cumulative evictions."""
        with self._lock:
            self._evicted.update(evictions)
        self._say()

    def totals(self) -> dict[str, dict[str, int]]:
        """Metric -> map -> entries lost so far."""
        with self._lock:
            return {"slotune_bpf_map_full_total": {name: self._kernel[name] + self._user[name] for name in REFUSING},
                    "slotune_bpf_map_evicted_total": dict(self._evicted)}

    def _say(self) -> None:
        lost = [(metric, name) for metric, per_map in self.totals().items() for name, n in per_map.items() if n]
        with self._lock:
            first = [(metric, name) for metric, name in lost if name not in self._said]
            self._said.update(name for _, name in first)
        for metric, name in first:
            log.warning("BPF map %s is full (%d entries) and %s: %s. Raise %s.%s "
                        '(e.g. to %d) and restart slotune; %s{map="%s"} counts them',
                        name, self.entries[name], LOST[metric][0], EFFECT[name], CONFIG_KEY, name,
                        min(self.entries[name] * 2, MAP_ENTRIES_RANGE[1]), metric, name)

    def collect(self):
        for metric, per_map in self.totals().items():
            fam = CounterMetricFamily(metric, LOST[metric][1], labels=["map"])
            for name, n in per_map.items():
                fam.add_metric([name], float(n))
            yield fam
