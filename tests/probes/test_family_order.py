"""Any subset of the probe families, named in any order, builds one program:
`probes = ["http", "tls"]` did not compile (http's C calls the tls family's
hook, which was joined after it). make_families puts the families in FAMILIES
order whatever order they are named in; every single family and every pair
where one family's C tests for the other (#ifdef FAMILY_<NAME>: the hooks) and
all of them are compiled here, named in reverse order. Pairs with no hook between
them build the same C as their singles side by side, and cost a second each."""
import itertools
import re

import pytest

from daemon.collectors.kernel.families import FAMILIES, make_families
import bpf as bpf_sources
from daemon.collectors.kernel.program import Program

NAMES = list(FAMILIES)


def hooked(a: str, b: str) -> bool:
    """Does either family's C compile differently with the other present?"""
    text = {n: bpf_sources.source(FAMILIES[n]().source) for n in (a, b)}
    return bool(re.search(rf"defined\(FAMILY_{b.upper()}\)|def FAMILY_{b.upper()}\b", text[a])
                or re.search(rf"defined\(FAMILY_{a.upper()}\)|def FAMILY_{a.upper()}\b", text[b]))


COMPILED = ([[n] for n in NAMES] + [[b, a] for a, b in itertools.combinations(NAMES, 2) if hooked(a, b)]
            + [list(reversed(NAMES))])


def test_the_order_families_are_named_in_does_not_change_the_program():
    for size in range(1, len(NAMES) + 1):
        for subset in itertools.combinations(NAMES, size):
            built = [f.name for f in make_families(list(subset))]
            assert built == list(subset)                       # FAMILIES order, as combinations() gives
            for order in itertools.permutations(subset):
                assert [f.name for f in make_families(list(order))] == built
    assert [f.name for f in make_families(["tls", "tls"])] == ["tls"]
    with pytest.raises(ValueError, match="unknown probe family"):
        make_families(["http", "nope"])


def test_the_hooked_pairs_are_found():
    assert {"http+tls", "offcpu+runqueue"} <= {"+".join(sorted(c)) for c in COMPILED if len(c) == 2}


@pytest.mark.parametrize("names", COMPILED, ids="+".join)
def test_every_family_and_pair_compiles_named_in_reverse(root_only, names):
    program = Program(make_families(names))
    try:
        assert [f.name for f in program.families] == [n for n in NAMES if n in names], program.off
    finally:
        program.close()
