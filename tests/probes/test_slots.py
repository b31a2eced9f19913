"""bpf/common.h slot_of() must put every value in the bucket daemon/histogram.py
slot_of() expects: values are pushed into the kernel's arithmetic as a syscall
argument (raw_syscalls:sys_enter sees args[0] of getppid, which ignores it)."""
import ctypes
import os

from slotune.collectors.kernel.maps import items
from slotune.collectors.kernel.program import program_text
from slotune.model.histogram import SLOTS, slot_of

PROBE = """
int on_enter(struct tracepoint__raw_syscalls__sys_enter *args)
{
    if (current_tgid() != SELF_TGID || args->id != SYS_GETPPID)
        return 0;
    hist_add(1, 1, 0, args->args[0]);
    return 0;
}
"""

VALUES = sorted({*range(0, 40), *[(1 << k) + d for k in range(3, 63) for d in (-1, 0, 1)],
                 123456789, 10 ** 12, 2 ** 64 - 1})


def test_kernel_slots_equal_python_slots(root_only):
    from bcc import BPF
    text = program_text([]) + f"\n#define SELF_TGID {os.getpid()}\n#define SYS_GETPPID 110\n" + PROBE
    b = BPF(text=text)
    try:
        b.attach_tracepoint(tp="raw_syscalls:sys_enter", fn_name="on_enter")
        libc = ctypes.CDLL(None, use_errno=True)
        got = {}
        for v in VALUES:
            libc.syscall(110, ctypes.c_ulong(v))
            slots = {k.slot: bucket.count for k, bucket in items(b["hists"])}
            new = {s for s, c in slots.items() if c != got.get(s, 0)}
            assert len(new) == 1, f"value {v}: expected one bucket to move, got {new}"
            slot = new.pop()
            assert slot == slot_of(v), f"value {v}: kernel slot {slot}, Python slot {slot_of(v)}"
            got = slots
        assert max(got) == SLOTS - 1       # the largest values clamp into the last slot
    finally:
        b.cleanup()
