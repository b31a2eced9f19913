"""What a probe family declares: its name in the config, its bpf/<source>.bpf.c,
the signals it produces with the metric each becomes, where it attaches, and
its own maps that daemon.bpf_map_entries sizes. Each family module subclasses
Family once; families/ finds them."""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from slotune.collectors.kernel.helpers import Helper

Points = tuple[tuple[str, str], ...]    # (tracepoint, the program's function on it)


class Map(NamedTuple):
    """One of a family's BPF maps, sized by daemon.bpf_map_entries.<name> (MAX_<NAME> in C)."""
    entries: int         # its default size
    evicts: bool         # an LRU hash: when full, an insert evicts the least recently used entry
                         # (slotune_bpf_map_evicted_total); else a full map refuses it (_full_total)
    loses: str           # what a lost entry costs, for the log line that says so


class Signal(NamedTuple):
    """A Sample signal a family produces and the metric the exporter makes of it."""
    name: str            # Sample key, e.g. "tcp_rtt"; its id is SIG_TCP_RTT on the C side
    metric: str          # full metric name, e.g. slotune_tcp_rtt_seconds
    label: str | None    # name of the label the Sample key's label goes into, or None
    kind: str            # "histogram", "counter" or "gauge"
    help: str


@dataclass(frozen=True)
class Attachment:
    """One attach point: a tracepoint ("sched:sched_switch"), attached through its
    trace record or raw (the program gets the tracepoint's own arguments), or a
    uprobe on a library."""
    kind: str            # "tracepoint", "raw_tracepoint", "uprobe", "uretprobe"
    target: str          # tracepoint name (category:name), or library path for uprobes
    fn: str              # BPF function name
    symbol: str = ""     # uprobe symbol

    @property
    def probe(self) -> str:
        """The name users see in slotune_probe_attached{probe}."""
        if self.kind in ("tracepoint", "raw_tracepoint"):
            return self.target
        return f"{self.kind}:{self.target}:{self.symbol}"


class Family:
    """A probe family: one bpf/<source>.bpf.c plus what it attaches and how labels read."""
    name = ""                                         # in daemon.probes and `slotune probes --family`
    source = ""                                       # bpf/<source>.bpf.c
    signals: tuple[Signal, ...] = ()
    times: tuple[str, ...] = ()                       # the protocols whose requests it times ("HTTP/1")
    tracepoints: Points = ()                          # (tracepoint, fn)
    raw_tracepoints: Points = ()                      # (tracepoint, fn) attached raw: no trace record
    defines: dict[str, int] = {}                      # label ids and the like, as C #defines
    helpers: tuple[Helper, ...] = ()                  # BPF helpers it calls that Linux 5.11 lacks
    # Counters kept in per-CPU arrays (no hash, no atomic on the hot path): array name ->
    # (its counter signal, labels per service); a series' slot is service id * labels + label.
    service_arrays: dict[str, tuple[str, int]] = {}
    maps: dict[str, Map] = {}                         # its maps sized by daemon.bpf_map_entries, by name
    hooks: tuple[tuple[str, str], ...] = ()           # (shared attach point, its C function): hooks.py
    claims: tuple[str, ...] = ()                      # points where its hooks keep what they claim: run first

    @classmethod
    def attach_points(cls) -> list[str]:
        """Where it attaches, as `slotune probes --list` shows it."""
        return [tp for tp, _ in (*cls.tracepoints, *cls.raw_tracepoints)]

    def label(self, signal: str, label_id: int, service: str) -> str:
        """A series' label from its id in the kernel's key, for one service's series."""
        return ""

    def refresh(self, program, targets: dict, service_ids: dict[str, int]) -> None:
        """Called each interval with the Program, {service: ServiceProcesses} and {service: id}."""
