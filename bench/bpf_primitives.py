"""What the single operations slotune's probes are built from cost on this kernel,
in ns each: a clock read, the current task's id, a user or a kernel read, a hash,
LRU-hash or per-CPU array lookup, a histogram bump as bpf/common.h's hist_add does
it (the probes' own helpers, compiled after bpf/common.h). Each is a program of its own on the raw sys_enter tracepoint that does the
operation REPEAT times for this process's getppid() loop only; the kernel times
each program (kernel.bpf_stats_enabled, on while this runs), and an operation's
cost is its program's ns a run less the bare program's (the same pid test), over
REPEAT. Programs alternate round by round; figures are medians with their range.
What a watched request's signals need, summed, is a floor no program that keeps
them can go under: beside a server's untraced cost a request, it says how much
of its throughput slotune can keep at best (docs/overhead.md, issue 21).

    python -m bench.bpf_primitives [--rounds 7] [--seconds 0.3]"""
from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys
import time

from bench.server_overhead import bpf_stats_on
from slotune.collectors.kernel.program import program_text
from slotune.collectors.kernel.program_cost import run_stats

REPEAT = 4
# After bpf/common.h (program_text: its #defines, helpers and shared maps), the
# bench's own maps.
MAPS = r"""
BPF_ARRAY(config, u64, 1);                           /* [0]: a user address in this process */
BPF_PERCPU_ARRAY(sink, u64, 1);                      /* keeps each result alive */
BPF_HASH(hash, u64, u64, 1024);
BPF_TABLE("lru_hash", u64, u64, lru, 1024);
BPF_PERCPU_ARRAY(counters, u64, 16);
struct big { char bytes[256]; };
BPF_PERCPU_ARRAY(bigbuf, struct big, 1);

static __always_inline void keep(u64 v)
{
    u32 zero = 0;
    u64 *s = sink.lookup(&zero);
    if (s)
        *s += v;
}
static __always_inline u64 user_addr(void)
{
    u32 zero = 0;
    u64 *a = config.lookup(&zero);
    return a ? *a : 0;
}
"""
# name -> (what it is, as the table says it; the C that does it once, for the i-th time)
PRIMITIVES = {
    "ktime": ("bpf_ktime_get_ns (a clock read)", "acc += bpf_ktime_get_ns();"),
    "jiffies": ("bpf_jiffies64 (inlined by the verifier)", "acc += bpf_jiffies64();"),
    "pidtgid": ("bpf_get_current_pid_tgid (the watched test's tid)", "acc += current_tid();"),
    "ptregs": ("bpf_task_pt_regs(current): the syscall's registers", "acc += PT_REGS_PARM2(current_regs());"),
    "user8": ("bpf_probe_read_user, 8 bytes",
              "u64 v = 0; bpf_probe_read_user(&v, 8, (void *)(user_addr() + 8 * i)); acc += v;"),
    "user256": ("bpf_probe_read_user, 256 bytes (a header block)",
                "u32 z = 0; struct big *b = bigbuf.lookup(&z);"
                " if (b) { bpf_probe_read_user(b->bytes, 256, (void *)user_addr()); acc += b->bytes[i]; }"),
    "ustr16": ("bpf_probe_read_user_str, 16 bytes",
               "char v[16] = {}; bpf_probe_read_user_str(v, 16, (void *)(user_addr() + 8 * i)); acc += v[3];"),
    "ustr256": ("bpf_probe_read_user_str, 256 bytes",
                "u32 z = 0; struct big *b = bigbuf.lookup(&z);"
                " if (b) { bpf_probe_read_user_str(b->bytes, 256, (void *)user_addr()); acc += b->bytes[i]; }"),
    "kernel4": ("bpf_probe_read_kernel, 4 bytes (a socket field)",
                "u32 z = 0; u64 *k = config.lookup(&z); u32 v = 0;"
                " if (k) bpf_probe_read_kernel(&v, 4, (void *)k); acc += v;"),
    "hash": ("hash map lookup, u64 key, present", "u64 key = i + 1; u64 *v = hash.lookup(&key); if (v) acc += *v;"),
    "lru": ("LRU hash lookup, u64 key, present (a connection)",
            "u64 key = i + 1; u64 *v = lru.lookup(&key); if (v) acc += *v;"),
    "percpu": ("per-CPU array slot += 1 (a counter)", "u32 slot = i; u64 *v = counters.lookup(&slot); if (v) (*v)++;"),
    "hist": ("histogram bump: hash lookup_or_try_init + 2 atomic adds",
             "hist_add(1, SIG_HTTP_REQUEST, 0, 1000000 + i); acc += i;"),
}
PROGRAM = """
int prim_%s(struct bpf_raw_tracepoint_args *ctx)
{
    if ((bpf_get_current_pid_tgid() >> 32) != TGID)
        return 0;
    u64 acc = 0;
    #pragma unroll
    for (int i = 0; i < REPEAT; i++) { %s }
    keep(acc);
    return 0;
}
"""


def source() -> str:
    """bpf/common.h, the bench's maps, then a program for the bare test and one for each
    primitive: the probes' own helpers (current_tid, current_regs, hist_add) are timed."""
    bodies = {"bare": "acc += i;", **{name: body for name, (_, body) in PRIMITIVES.items()}}
    return program_text([]) + MAPS + "".join(PROGRAM % item for item in bodies.items())


# A watched HTTP/1.x request as bpf/http.bpf.c sees nginx's keep-alive one: the
# request's read and the response's writev, each its watched test and its
# connection's lookup; the writev's registers, its iovec array and its header
# block read for the status line; the arrival and the status class counted.
REQUEST_COUNTS = {"pidtgid": 2, "lru": 2, "ptregs": 1, "user8": 1, "user256": 1, "percpu": 2}
# ... and timed: a clock read at each, the first byte's bump at the write and the
# whole request's at the next read.
REQUEST_TIMING = {"ktime": 2, "hist": 2}


def measure(bpf, name: str, seconds: float) -> float:
    """ns a run of program prim_<name> over `seconds` of this process's getppid() loop."""
    fn = bpf.funcs[f"prim_{name}".encode()]
    before = run_stats(fn.fd)
    bpf.attach_raw_tracepoint(tp=b"sys_enter", fn_name=fn.name)
    try:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for _ in range(2000):
                os.getppid()
    finally:
        bpf.detach_raw_tracepoint(tp=b"sys_enter")
    after = run_stats(fn.fd)
    if before is None or after is None:
        raise SystemExit("this kernel does not time BPF programs (no run_time_ns in their fdinfo: Linux >= 5.1)")
    if after[1] == before[1]:
        raise SystemExit(f"{fn.name.decode()} never ran on raw_syscalls:sys_enter during the getppid() loop")
    return (after[0] - before[0]) / (after[1] - before[1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.bpf_primitives", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--seconds", type=float, default=0.3, help="getppid() loop per program per round")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("run as root: loading BPF programs needs CAP_BPF+CAP_PERFMON")
    from bcc import BPF

    user = (ctypes.c_uint64 * 64)(*[0x4142434445464748] * 63, 0)   # the bytes the user reads read: no NUL till the end
    bpf = BPF(text=source(), cflags=[f"-DTGID={os.getpid()}", f"-DREPEAT={REPEAT}", "-Wno-unused-value"])
    bpf["config"][ctypes.c_int(0)] = ctypes.c_uint64(ctypes.addressof(user))
    for table in ("hash", "lru"):
        for key in range(1, REPEAT + 1):
            bpf[table][ctypes.c_uint64(key)] = ctypes.c_uint64(key)
    names = ["bare", *PRIMITIVES]
    for name in names:
        bpf.load_func(f"prim_{name}".encode(), BPF.RAW_TRACEPOINT)
    runs: dict[str, list[float]] = {n: [] for n in names}
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    try:
        with bpf_stats_on():
            for r in range(args.rounds):
                order = names[r % len(names):] + names[:r % len(names)]
                for name in order:
                    runs[name].append(measure(bpf, name, args.seconds))
                print(f"  round {r + 1}/{args.rounds}", file=sys.stderr)
    finally:
        bpf.cleanup()
    bare = runs["bare"]
    print(f"BPF primitives, {started}, kernel {os.uname().release}, {args.rounds} rounds x "
          f"{args.seconds} s, each operation {REPEAT} times a run; ns each, median [range] over rounds")
    print(f"  the bare program (pid test, statistics on): {statistics.median(bare):.0f} ns a run "
          f"[{min(bare):.0f}-{max(bare):.0f}]")
    width = max(len(what) for what, _ in PRIMITIVES.values())
    cost = {}
    for name, (what, _) in PRIMITIVES.items():
        each = [(t - b) / REPEAT for t, b in zip(runs[name], bare)]
        cost[name] = statistics.median(each)
        print(f"  {what:<{width}}  {cost[name]:6.1f}  [{min(each):5.1f} - {max(each):5.1f}]")
    counts = sum(cost[name] * n for name, n in REQUEST_COUNTS.items())
    timing = sum(cost[name] * n for name, n in REQUEST_TIMING.items())
    print(f"  a watched request as bpf/http.bpf.c sees nginx's (a read; a writev of header and body), "
          f"its operations alone: exact counts {counts:.0f} ns, per-request timing {timing:.0f} ns more")
    return 0


if __name__ == "__main__":
    sys.exit(main())
