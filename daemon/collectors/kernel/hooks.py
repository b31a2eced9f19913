"""The attach points several probe families read. The kernel runs one program per
tracepoint from an object, so a family never defines the program on a shared
point: it declares a hook there (`Family.hooks`: point -> its C function), and
the program builder generates one dispatcher per point, `hook_<point>`, that
calls the enabled families' hooks in FAMILIES order, those that claim what
they keep there (`Family.claims`) first. The programs on the points
call the dispatchers (bpf/shared.bpf.c; the exec program in
bpf/targeting.bpf.c). No family's C names another family's, so any subset of
families, named in any order, builds."""
from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from slotune.collectors.kernel.family import Family


class Point(NamedTuple):
    """A shared attach point, as its hooks see it."""
    params: str          # the C parameters every hook on it takes
    args: str            # the names the dispatcher passes on
    claims: bool         # hooks return int, and the first to return nonzero ends the call (a
                         # socket one family keeps as its own is no other's business: the
                         # families that claim there go first); else each is called, void
    group: str           # points one set of programs calls: all generated once any is hooked
    always: bool = False  # slotune's own program calls it: generated even with no hook


POINTS = {
    "process_exec": Point("u32 old_pid", "old_pid", False, "exec", always=True),
    "sched_switch": Point("struct sched_switch *s", "s", False, "sched_switch"),
    "sock_received": Point("struct sock_io *io, long nr", "io, nr", True, "sock"),
    "sock_sent": Point("struct sock_io *io, long nr", "io, nr", True, "sock"),
    "sock_ended": Point("u64 key", "key", False, "sock"),
}


def check(families: list[type[Family]]) -> None:
    """Every hook names a known point, at most one per point and family."""
    for family in families:
        points = [point for point, _ in family.hooks]
        if unknown := [p for p in points if p not in POINTS]:
            raise ValueError(f"probe family {family.name}: unknown hook point {', '.join(unknown)}; "
                             f"known: {', '.join(POINTS)}")
        if len(set(points)) != len(points):
            raise ValueError(f"probe family {family.name}: two hooks on one point")
        if stray := [p for p in family.claims if p not in points or not POINTS[p].claims]:
            raise ValueError(f"probe family {family.name}: claims on {', '.join(stray)}, where it has no hook "
                             "or hooks cannot claim")


def used(families: list[Family]) -> dict[str, list[str]]:
    """The points this program generates, each with its hooks' functions in order."""
    groups = {POINTS[point].group for f in families for point, _ in f.hooks}
    return {point: [fn for f in sorted(families, key=lambda f: point not in f.claims)   # stable: else FAMILIES order
                    for p, fn in f.hooks if p == point]
            for point, spec in POINTS.items() if spec.always or spec.group in groups}


def defines(families: list[Family]) -> dict[str, int]:
    """HOOK_<POINT> 1 for each generated point: bpf/shared.bpf.c builds its programs by them."""
    return {f"HOOK_{point.upper()}": 1 for point in used(families)}


def signature(point: str) -> str:
    spec = POINTS[point]
    return f"static __always_inline {'int' if spec.claims else 'void'} hook_{point}({spec.params})"


def declarations(families: list[Family]) -> str:
    """The dispatchers' prototypes: slotune's own programs come before the families' C."""
    return "\n".join(f"{signature(point)};" for point in used(families))


def dispatchers(families: list[Family]) -> str:
    """The dispatchers' definitions, after every family's C."""
    out = []
    for point, fns in used(families).items():
        spec = POINTS[point]
        if spec.claims:
            body = [f"    if ({fn}({spec.args}))\n        return 1;" for fn in fns] + ["    return 0;"]
        else:
            body = [f"    {fn}({spec.args});" for fn in fns]
        out.append("\n".join([signature(point), "{", *body, "}"]))
    return "\n\n".join(out)
