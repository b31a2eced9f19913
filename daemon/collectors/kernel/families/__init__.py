"""Every probe family slotune has: each is one module in this package (its Family
subclass) and its C, bpf/<source>.bpf.c; FAMILIES finds them, in name order, the
order their programs are built in and their signals numbered. Their signals are
registered with the exporter here, beside the kernel collector's own."""
from __future__ import annotations

import importlib
import inspect
import pkgutil

from slotune.collectors.kernel import hooks
from slotune.collectors.kernel.family import Family
from slotune.export.samples import register_signals


def _found() -> list[type[Family]]:
    """The Family subclasses the modules of this package define."""
    out = []
    for module in pkgutil.iter_modules(__path__):
        loaded = importlib.import_module(f"{__name__}.{module.name}")
        out += [c for _, c in inspect.getmembers(loaded, inspect.isclass)
                if issubclass(c, Family) and c is not Family and c.__module__ == loaded.__name__]
    return out


FAMILIES: dict[str, type[Family]] = {f.name: f for f in sorted(_found(), key=lambda f: f.name)}
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
