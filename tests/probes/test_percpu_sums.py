"""maps.percpu_sums(), the kernel collector's read of its per-CPU counters (the
http family's requests and status classes by service, map_full), against BCC's
own read of each slot: ranges at the start, inside and at the end of a real
per-CPU array. (Its slot-by-slot path is for kernels before 5.6, not this one.)"""
import ctypes
import random

from slotune.collectors.kernel import maps


def test_one_batch_reads_what_bccs_slot_by_slot_reads(root_only):
    from bcc import BPF
    b = BPF(text="BPF_PERCPU_ARRAY(counts, u64, 4096); int unused(void *ctx) { return 0; }")
    table, rng = b["counts"], random.Random(7)
    for slot in rng.sample(range(4096), 300) + [0, 4095]:
        table[ctypes.c_int(slot)] = table.Leaf(*(rng.randrange(1 << 48) for _ in range(table.total_cpu)))
    for first, count in ((0, 3), (8, 24), (1, 4095), (4088, 8), (4095, 1)):
        by_slot = [table.sum(ctypes.c_int(first + i)).value for i in range(count)]
        assert maps.percpu_sums(table, first, count) == by_slot, (first, count)
