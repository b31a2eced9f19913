"""Every probe family slotune has, in the order their programs are built and
their signals numbered. Adding one is its module beside this file, its
bpf/<name>.bpf.c, and one entry in FAMILIES. Their signals are registered with
the exporter here, beside the kernel collector's own."""
from __future__ import annotations

from daemon.collectors.kernel.exec import Exec
from daemon.collectors.kernel import hooks
from daemon.collectors.kernel.family import Family
from daemon.collectors.kernel.http import Http
from daemon.collectors.kernel.offcpu import OffCpu
from daemon.collectors.kernel.runqueue import RunQueue
from daemon.collectors.kernel.tcp import Tcp
from daemon.collectors.kernel.tls import Tls
from daemon.export.samples import register_signals

# The order is the order of their C and of their hooks on a shared point (hooks.py):
# http's claims the sockets it keeps as HTTP/1.x connections before tls's looks.
FAMILIES: dict[str, type[Family]] = {f.name: f for f in (RunQueue, OffCpu, Tcp, Http, Tls, Exec)}
hooks.check(list(FAMILIES.values()))

register_signals({s.name: (s.metric, s.label, s.kind, s.help) for f in FAMILIES.values() for s in f.signals})
register_signals({     # the kernel collector's own, beside its families'
    "processes": ("slotune_service_processes", None, "gauge",
                  "Processes currently found for the service"),
})

# Signal ids shared with the C side as SIG_<NAME>, numbered from 1 in FAMILIES
# order; both sides are built together, so an id never outlives one program.
SIGNAL_IDS = {s.name: i for i, s in enumerate((s for f in FAMILIES.values() for s in f.signals), start=1)}
SIGNAL_NAMES = {i: name for name, i in SIGNAL_IDS.items()}


def make_families(names: list[str] | None = None) -> list[Family]:
    """The families named (all where None), in FAMILIES order whatever order they are
    named in (the order their hooks run in), one named twice built once."""
    names = list(FAMILIES) if names is None else names
    unknown = [n for n in names if n not in FAMILIES]
    if unknown:
        raise ValueError(f"unknown probe family {', '.join(unknown)}; known: {', '.join(FAMILIES)}")
    return [family() for name, family in FAMILIES.items() if name in names]
