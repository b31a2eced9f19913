"""Any subset of the probe families, named in any order, builds one program:
`probes = ["http", "tls"]` did not compile (http's C calls the tls family's
hook, which was joined after it). make_families puts the families in FAMILIES
order whatever order they are named in; every single family and every pair
(where the families' C calls one another's hooks, under #ifdef FAMILY_<NAME>)
is compiled here, named in reverse order."""
import itertools

import pytest

from daemon.collectors.kernel.families import FAMILIES, make_families
from daemon.collectors.kernel.program import Program

NAMES = list(FAMILIES)


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


@pytest.mark.parametrize("names", [list(reversed(c)) for size in (1, 2) for c in itertools.combinations(NAMES, size)]
                         + [list(reversed(NAMES))], ids="+".join)
def test_every_family_and_pair_compiles_named_in_reverse(root_only, names):
    program = Program(make_families(names))
    try:
        assert [f.name for f in program.families] == [n for n in NAMES if n in names], program.off
    finally:
        program.close()
