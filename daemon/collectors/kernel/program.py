"""One BPF object holding every enabled probe family this kernel can run (a family
calling a BPF helper the kernel lacks is left out, said in one line: helpers.py):
builds its exact text (generated #defines, bpf/common.h, the shared points'
dispatcher prototypes, bpf/targeting.bpf.c, each family's file, the dispatchers
and bpf/shared.bpf.c's programs on the shared points: hooks.py), compiles it with BCC, attaches probes one by one (a failure is recorded,
the rest go on) and reads the shared aggregation maps as cumulative values, how
many inserts into a full map were refused, and what the LRU maps' entries and
changes are (evictions.py)."""
from __future__ import annotations

import atexit
import ctypes
import logging

import numpy as np

from slotune import bpf as bpf_sources
from slotune.collectors.kernel import hooks
from slotune.collectors.kernel.families import FAMILIES, SIGNAL_IDS
from slotune.collectors.kernel.family import Attachment, Family
from slotune.collectors.kernel.helpers import missing
from slotune.collectors.kernel.maps import arrays, entry_count, percpu_sums
from slotune.model.histogram import SLOTS, SUB, SUB_BITS

log = logging.getLogger(__name__)

# watched_hint slots; a task's slot is tid % HINT_SLOTS. Every hot path reads one, so
# the array stays small enough to live in cache (4096 x 8 bytes); a slot shared with a
# watched task costs an unwatched one a hash lookup, nothing worse.
HINT_SLOTS = 4096
# Constants bpf/common.h shares with Python, handed to C as #defines: the histogram
# layout of daemon/model/histogram.py.
SHARED_WITH_C = {"SUB_BITS": SUB_BITS, "SUB": SUB, "SLOTS": SLOTS, "HINT_SLOTS": HINT_SLOTS}
# The shared maps bpf/common.h declares, with their default sizes.
SHARED_MAPS = {"hists": 32768,      # non-empty buckets over every series, each with its sum
               "counts": 4096,      # counters: one per (service, signal, label)
               "watched": 65536}    # task id -> service id
FAMILY_MAPS = {name: m for family in FAMILIES.values() for name, m in family.maps.items()}
# Every map daemon.bpf_map_entries sizes, with its default size (MAX_<NAME> in C).
MAP_ENTRIES = {**SHARED_MAPS, **{name: m.entries for name, m in FAMILY_MAPS.items()}}
MAP_ENTRIES_RANGE = (64, 4194304)   # below 64 one busy signal fills a map; 2**22 is Linux's largest pid_max
# The maps that refuse an insert when full, in map-id order (MAP_<NAME>, the index into
# map_full), and the LRU maps, which evict instead, in LRU-id order (LRU_<NAME>, the
# index into lru_changes).
REFUSING = tuple(name for name in MAP_ENTRIES if name not in FAMILY_MAPS or not FAMILY_MAPS[name].evicts)
EVICTING = tuple(name for name, m in FAMILY_MAPS.items() if m.evicts)

TARGETING_TRACEPOINTS = (("sched:sched_process_fork", "on_process_fork"),
                         ("sched:sched_process_exit", "on_process_exit"))


# The compiler BCC links (its code is ~70 MiB of the daemon's RSS once a compile has run it).
COMPILER_LIBRARIES = ("libLLVM", "libclang")
MADV_DONTNEED, MADV_PAGEOUT = 4, 21   # PAGEOUT: Linux >= 5.4


def release_compiler_memory() -> None:
    """After the one compile: give the heap the compiler freed back to the system (glibc
    keeps it, about 20 MiB for the daemon's whole life) and drop the compiler's code
    (its r-xp mappings, never written: read back from the library file should it ever
    run again). PAGEOUT frees the pages no other process maps; DONTNEED then unmaps
    from us those another BCC user shares, which stay in its memory. Each step a no-op
    where libc or the kernel lacks it."""
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        libc.malloc_trim(0)
    except AttributeError:
        pass
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    with open("/proc/self/maps") as maps:
        code = [line.split() for line in maps if " r-xp " in line and any(lib in line for lib in COMPILER_LIBRARIES)]
    for fields in code:
        start, end = (int(x, 16) for x in fields[0].split("-"))
        for advice in (MADV_PAGEOUT, MADV_DONTNEED):
            libc.madvise(start, end - start, advice)   # EINVAL where the kernel lacks one: left as it is


def raw_name(tracepoint: str) -> str:
    """A raw tracepoint is named without its category: "tcp:tcp_probe" -> "tcp_probe"."""
    return tracepoint.split(":", 1)[-1]


def attach_tracepoint(bpf, a: Attachment) -> None:
    """Attach a tracepoint Attachment to a BCC object, through its record or raw."""
    if a.kind == "raw_tracepoint":
        bpf.attach_raw_tracepoint(tp=raw_name(a.target), fn_name=a.fn)
    else:
        bpf.attach_tracepoint(tp=a.target, fn_name=a.fn)


def detach_tracepoint(bpf, a: Attachment) -> None:
    if a.kind == "raw_tracepoint":
        bpf.detach_raw_tracepoint(tp=raw_name(a.target))
    else:
        bpf.detach_tracepoint(a.target)


def program_text(families: list[Family], entries: dict[str, int] | None = None) -> str:
    """The exact C text BCC compiles for these families, with these map sizes
    (name -> entries; a map not named keeps its MAP_ENTRIES default)."""
    sizes = {**MAP_ENTRIES, **(entries or {})}
    defines = {**SHARED_WITH_C,
               **{f"MAP_{name.upper()}": i for i, name in enumerate(REFUSING)}, "MAP_IDS": len(REFUSING),
               **{f"LRU_{name.upper()}": i for i, name in enumerate(EVICTING)}, "LRU_IDS": len(EVICTING),
               **{f"MAX_{name.upper()}": sizes[name] for name in MAP_ENTRIES},
               **{f"SIG_{name.upper()}": sid for name, sid in SIGNAL_IDS.items()}}
    for family in families:
        defines.update(family.defines)
    defines.update(hooks.defines(families))
    parts = ["/* generated by slotune: constants and ids shared with daemon/collectors/kernel */"]
    parts += [f"#define {k} {v}" for k, v in defines.items()]
    parts.append(f"\n/* ---- bpf/common.h ---- */\n{bpf_sources.header('common')}")
    parts.append(f"/* ---- generated: the shared points' dispatchers (hooks.py) ---- */\n{hooks.declarations(families)}\n")
    parts.append(f"/* ---- bpf/targeting.bpf.c ---- */\n{bpf_sources.source('targeting')}")
    for family in families:
        parts.append(f"/* ---- bpf/{family.source}.bpf.c ---- */\n{bpf_sources.source(family.source)}")
    parts.append(f"/* ---- generated: each calls the families' hooks in order (hooks.py) ---- */\n"
                 f"{hooks.dispatchers(families)}\n")
    parts.append(f"/* ---- bpf/shared.bpf.c ---- */\n{bpf_sources.source('shared')}")
    return "\n".join(parts)


class Program:
    """The loaded BPF object; attach() records each probe's outcome in `attached`, and
    `off` the families left out: name -> (why, fix)."""

    def __init__(self, families: list[Family], entries: dict[str, int] | None = None):
        from bcc import BPF  # imported here: `slotune probes --print` needs no BCC
        self.off = {f.name: why for f in families if (why := missing(f))}
        for name, (detail, fix) in self.off.items():
            log.warning("%s probes: %s; fix: %s", name, detail, fix)
        self.families = [f for f in families if f.name not in self.off]
        self.text = program_text(self.families, entries)
        self.bpf = BPF(text=self.text.encode(), cflags=["-Wno-unused-function"])
        atexit.unregister(self.bpf.cleanup)   # close() detaches; nothing global keeps us alive
        release_compiler_memory()
        self.attached: dict[str, bool] = {}
        self.attachments: dict[str, Attachment] = {}   # probe -> what attach() was given
        self.errors: dict[str, str] = {}

    def attach(self, a: Attachment) -> bool:
        if a.probe in self.attached and self.attached[a.probe]:
            return True
        self.attachments[a.probe] = a
        try:
            if a.kind in ("tracepoint", "raw_tracepoint"):
                attach_tracepoint(self.bpf, a)
            elif a.kind == "uprobe":
                self.bpf.attach_uprobe(name=a.target, sym=a.symbol, fn_name=a.fn)
            else:
                self.bpf.attach_uretprobe(name=a.target, sym=a.symbol, fn_name=a.fn)
            self.attached[a.probe] = True
        except Exception as exc:  # BCC raises bare Exception on attach failure
            if a.probe not in self.errors:
                log.warning("probe %s did not attach (%s); the other probes go on", a.probe, exc)
            self.errors[a.probe] = str(exc)
            self.attached[a.probe] = False
        return self.attached[a.probe]

    def detach_all(self) -> list[Attachment]:
        """Detach every attached probe, the maps kept (a benchmark alternates with and
        without the probes without compiling again); returns them for attach()."""
        detached = []
        for probe, on in self.attached.items():
            if not on:
                continue
            a = self.attachments[probe]
            if a.kind in ("tracepoint", "raw_tracepoint"):
                detach_tracepoint(self.bpf, a)
            elif a.kind == "uprobe":
                self.bpf.detach_uprobe(name=a.target, sym=a.symbol)
            else:
                self.bpf.detach_uretprobe(name=a.target, sym=a.symbol)
            self.attached[probe] = False
            detached.append(a)
        return detached

    def attach_tracepoints(self) -> None:
        for tp, fn in TARGETING_TRACEPOINTS:
            self.attach(Attachment("tracepoint", tp, fn))
        for family in self.families:
            for tp, fn in family.tracepoints:
                self.attach(Attachment("tracepoint", tp, fn))
            for tp, fn in family.raw_tracepoints:
                self.attach(Attachment("raw_tracepoint", tp, fn))

    def table(self, name: str):
        return self.bpf[name]

    def histograms(self) -> tuple[dict, dict]:
        """Cumulative (hist counts, sums ns), each keyed (service, signal, label): a
        series' sum is the sum of its buckets' sums."""
        keys, values = arrays(self.bpf["hists"])
        inside = keys["slot"] < SLOTS
        keys, values = keys[inside], values[inside]
        series = (keys["service"].astype(np.int64) << 32) | (keys["signal"].astype(np.int64) << 16) | keys["label"]
        ids, row = np.unique(series, return_inverse=True)
        counts = np.zeros((len(ids), SLOTS), dtype=np.int64)
        np.add.at(counts, (row, keys["slot"].astype(np.int64)), values["count"].astype(np.int64))
        sums = np.zeros(len(ids), dtype=np.uint64)
        np.add.at(sums, row, values["sum"])
        names = [(int(i) >> 32, (int(i) >> 16) & 0xFFFF, int(i) & 0xFFFF) for i in ids]
        return dict(zip(names, counts)), dict(zip(names, sums.tolist()))

    def counters(self, service_ids=()) -> dict:
        """Cumulative counters keyed (service, signal, label): the shared `counts` map's,
        and for these service ids each family's per-CPU arrays by service id (summed)."""
        out = self._by_series("counts")
        for family in self.families:
            for name, (signal, labels) in family.service_arrays.items():
                table = self.bpf[name]
                ids = [sid for sid in service_ids if (sid + 1) * labels <= table.max_entries]
                if not ids:
                    continue
                first = min(ids) * labels
                sums = percpu_sums(table, first, (max(ids) + 1) * labels - first)
                for sid in ids:
                    for label in range(labels):
                        if n := sums[sid * labels + label - first]:
                            out[(sid, SIGNAL_IDS[signal], label)] = n
        return out

    def _by_series(self, name: str) -> dict:
        """A map keyed (service, signal, label) as a dict of ints."""
        keys, values = arrays(self.bpf[name])
        series = zip(keys["service"].tolist(), keys["signal"].tolist(), keys["label"].tolist())
        return dict(zip(series, values.tolist()))

    def map_full(self) -> dict[str, int]:
        """Inserts the kernel side refused so far, per map name (bpf/common.h map_full)."""
        return dict(zip(REFUSING, percpu_sums(self.bpf["map_full"], 0, len(REFUSING))))

    def lru_maps(self) -> list[str]:
        """The LRU maps in this object: its families'."""
        return [name for family in self.families for name, m in family.maps.items() if m.evicts]

    def lru_changes(self) -> dict[str, tuple[int, int]]:
        """New keys inserted and keys deleted so far, per LRU map (bpf/common.h lru_changes)."""
        n = len(EVICTING)
        sums = percpu_sums(self.bpf["lru_changes"], 0, 2 * n)
        return {name: (sums[i], sums[n + i]) for i, name in enumerate(EVICTING)}

    def entries(self, name: str) -> int:
        """How many entries map `name` holds now."""
        return entry_count(self.bpf[name])

    def fds(self) -> dict[str, int]:
        """Each loaded program's name -> its fd."""
        return {name.decode(): fn.fd for name, fn in list(self.bpf.funcs.items())}   # BCC names them in bytes

    def prog_ids(self) -> list[int]:
        """Kernel ids of the loaded programs (to check that close() leaves none)."""
        return [int(fdinfo(fd)["prog_id"]) for fd in self.fds().values()]

    def close(self) -> None:
        self.bpf.cleanup()


def fdinfo(fd: int) -> dict[str, str]:
    """The fields the kernel shows for one of this process's fds (/proc/self/fdinfo):
    for a loaded BPF program its prog_id, and its run_time_ns and run_cnt."""
    with open(f"/proc/self/fdinfo/{fd}") as f:
        return {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in f)}
