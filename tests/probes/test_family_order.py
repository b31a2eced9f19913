"""Any subset of the probe families, named in any order, builds one program.
`probes = ["http", "tls"]` once did not compile: http's C called a tls function
joined after it. Now no family's C names another's: where families read the
same tracepoint, each declares a hook and the builder generates the dispatcher
(daemon/collectors/kernel/hooks.py). Checked here: the names, the text for
every order of every subset, and a compile of every family alone, every pair
that shares a point (named in reverse), and all of them. Pairs that share no
point build the same C as their singles side by side."""
import itertools
import re

import pytest

from slotune import bpf as bpf_sources
from slotune.collectors.kernel import hooks
from slotune.collectors.kernel.families import FAMILIES, make_families
from slotune.collectors.kernel.program import Program, program_text

NAMES = list(FAMILIES)
DEFINED = re.compile(r"^static __always_inline \w+ \*?(\w+)\(|^BPF_\w+\((?:\"\w+\", [^,]+, [^,]+, )?(\w+)"
                     r"|^#define (\w+)|^struct (\w+) \{", re.M)


def defined(name: str) -> set[str]:
    """The functions, maps, macros and structs a family's C file defines."""
    text = bpf_sources.source(FAMILIES[name].source)
    return {next(g for g in m.groups() if g) for m in DEFINED.finditer(text)}


def sharing(a: str, b: str) -> bool:
    return bool({p for p, _ in FAMILIES[a].hooks} & {p for p, _ in FAMILIES[b].hooks})


COMPILED = ([[n] for n in NAMES] + [[b, a] for a, b in itertools.combinations(NAMES, 2) if sharing(a, b)]
            + [list(reversed(NAMES))])


def test_no_family_names_another():
    names = {n: defined(n) for n in NAMES}
    assert {"http_sock_received", "tls_forget", "offcpu_switch", "runqueue_since"} <= set().union(*names.values())
    for a, b in itertools.permutations(NAMES, 2):
        text = bpf_sources.source(FAMILIES[a].source)
        used = {n for n in names[b] if re.search(rf"\b{n}\b", text)}
        assert not used, f"bpf/{a}.bpf.c names bpf/{b}.bpf.c's {', '.join(sorted(used))}"
        assert f"FAMILY_{b.upper()}" not in text


def test_each_hook_is_a_function_its_family_defines():
    for name in NAMES:
        for point, fn in FAMILIES[name].hooks:
            assert point in hooks.POINTS
            assert fn in defined(name), f"{name}'s hook on {point}, {fn}, is not in bpf/{name}.bpf.c"


def test_the_order_families_are_named_in_does_not_change_the_program():
    for size in range(1, len(NAMES) + 1):
        for subset in itertools.combinations(NAMES, size):
            built = make_families(list(subset))
            assert [f.name for f in built] == list(subset)              # FAMILIES order, as combinations() gives
            text = program_text(built)
            for order in itertools.permutations(subset):
                assert program_text(make_families(list(order))) == text
    assert [f.name for f in make_families(["tls", "tls"])] == ["tls"]
    with pytest.raises(ValueError, match="unknown probe family"):
        make_families(["http", "nope"])


def test_a_dispatcher_calls_the_hooks_in_order_and_claiming_ones_stop():
    text = hooks.dispatchers(make_families(["tls", "http", "runqueue", "offcpu"]))
    assert text.index("http_sock_received(io, nr)") < text.index("tls_sock_received(io, nr)")
    assert "if (http_sock_received(io, nr))\n        return 1;" in text
    assert "    offcpu_switch(s);\n    runqueue_switch(s);" in text
    assert "exec_count" not in text and "void hook_process_exec(u32 old_pid)\n{\n}" in text   # slotune's own


def test_a_family_that_claims_a_point_goes_first_there_whatever_its_name():
    class Early(FAMILIES["tls"]):
        name = "a_tls"
    text = hooks.dispatchers([Early(), FAMILIES["http"]()])
    assert text.index("http_sock_received(io, nr)") < text.index("tls_sock_received(io, nr)")
    assert text.index("tls_forget(key)") < text.index("http_sock_ended(key)")     # no claims there: name order


def test_an_unknown_hook_point_is_refused():
    class Stray(FAMILIES["exec"]):
        hooks = (("sched_wake", "exec_count"),)
    with pytest.raises(ValueError, match="unknown hook point sched_wake"):
        hooks.check([Stray])


@pytest.mark.parametrize("names", COMPILED, ids="+".join)
def test_every_family_and_pair_sharing_a_point_compiles_named_in_reverse(root_only, names):
    program = Program(make_families(names))
    try:
        assert [f.name for f in program.families] == [n for n in NAMES if n in names], program.off
    finally:
        program.close()
