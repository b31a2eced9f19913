"""What the families' LRU maps evicted. The kernel does not count an LRU map's
evictions, so the programs count the keys they insert new and the keys they
delete (bpf/common.h lru_changes), and an entry neither deleted nor still held
was evicted: inserted - deleted - held, cumulative per map."""
from __future__ import annotations


class Evictions:
    """Reads each LRU map's evictions from a Program once per interval. The inserts are
    read before the entries are counted and the deletes after, so a change meanwhile can
    only make a reading low, never high; a reading with no change meanwhile is exact and
    stays so until the map's counts move again (its entries are not counted until then)."""

    def __init__(self):
        self.evicted: dict[str, int] = {}             # map -> evictions so far (never decreases)
        self.exact_at: dict[str, tuple[int, int]] = {}   # map -> (inserted, deleted) of its last exact reading

    def read(self, program) -> dict[str, int]:
        before = program.lru_changes()
        moved = [name for name in program.lru_maps() if self.exact_at.get(name) != before[name]]
        held = {name: program.entries(name) for name in moved}
        after = program.lru_changes() if moved else before
        for name in moved:
            gone = before[name][0] - after[name][1] - held[name]   # inserted, less deleted, less held
            self.evicted[name] = max(self.evicted.get(name, 0), gone)
            if before[name] == after[name]:
                self.exact_at[name] = before[name]
            else:
                self.exact_at.pop(name, None)
        return dict(self.evicted)

