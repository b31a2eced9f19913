"""What this kernel lets slotune do: capabilities, BTF, tracefs, headers, and
which probe kinds load and attach. Each check tries the real thing once and
returns a Finding with the reason and, when it fails, the exact fix."""
from __future__ import annotations

import contextlib
import os
import platform
import re
from dataclasses import dataclass
from pathlib import Path

TRACEFS = Path("/sys/kernel/tracing")
BTF_VMLINUX = Path("/sys/kernel/btf/vmlinux")
SETUP = "make -C <slotune checkout> setup   (or: sudo scripts/setup.sh)"

# Capability numbers from linux/capability.h.
CAP_SYS_ADMIN, CAP_PERFMON, CAP_BPF = 21, 38, 39


@dataclass(frozen=True)
class Finding:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    required: bool = False  # the daemon cannot run without it


def effective_capabilities(status_path: str = "/proc/self/status") -> int:
    for line in Path(status_path).read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def check_privileges() -> Finding:
    caps = effective_capabilities()
    has = lambda cap: bool(caps >> cap & 1)  # noqa: E731
    if has(CAP_SYS_ADMIN) or (has(CAP_BPF) and has(CAP_PERFMON)):
        who = "root" if os.geteuid() == 0 else "capabilities"
        return Finding("privileges", True, f"{who}: CAP_BPF+CAP_PERFMON or CAP_SYS_ADMIN present", required=True)
    return Finding("privileges", False, "missing CAP_BPF/CAP_PERFMON (and CAP_SYS_ADMIN)",
                   "run as root, or grant AmbientCapabilities=CAP_BPF CAP_PERFMON CAP_SYS_RESOURCE "
                   "(systemd/slotune.service does)", required=True)


def check_btf() -> Finding:
    if BTF_VMLINUX.exists():
        return Finding("BTF", True, f"{BTF_VMLINUX} present: struct offsets come from the running kernel")
    return Finding("BTF", False, f"{BTF_VMLINUX} missing: probes that need a struct field stay off",
                   "boot a kernel built with CONFIG_DEBUG_INFO_BTF=y")


def check_tracefs() -> Finding:
    if (TRACEFS / "events").is_dir():
        return Finding("tracefs", True, f"mounted at {TRACEFS}", required=True)
    return Finding("tracefs", False, f"not mounted at {TRACEFS}: BCC cannot build tracepoint programs",
                   f"mount -t tracefs nodev {TRACEFS}", required=True)


def header_release(build: Path) -> str | None:
    """Kernel release the headers under `build` were made for, or None."""
    utsrelease = build / "include" / "generated" / "utsrelease.h"
    if utsrelease.exists():
        m = re.search(r'UTS_RELEASE\s+"([^"]+)"', utsrelease.read_text())
        if m:
            return m.group(1)
    m = re.match(r"linux-headers-(.+)", build.resolve().name)
    return m.group(1) if m else None


def check_headers() -> Finding:
    release = platform.release()
    build = Path("/lib/modules") / release / "build"
    if not build.exists():
        return Finding("kernel headers", False, f"{build} missing: BCC cannot compile", SETUP, required=True)
    made_for = header_release(build)
    if made_for == release:
        return Finding("kernel headers", True, f"match the running kernel {release}")
    return Finding("kernel headers", False,
                   f"{build} holds headers for {made_for or 'an unknown release'}, kernel is {release}; "
                   "safe because slotune reads only tracepoint fields and BTF offsets (degraded, not fatal)",
                   f"install linux-headers-{release} if your distro carries it")


@contextlib.contextmanager
def quiet_stderr():
    """BCC prints its own errors on fd 2; doctor reports them in one line instead."""
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def _try(name: str, build, fix: str, required: bool = False) -> Finding:
    """Load and attach one probe with BCC; `build()` returns (BPF, description)."""
    try:
        with quiet_stderr():
            bpf, what = build()
            bpf.cleanup()
        return Finding(name, True, what, required=required)
    except Exception as exc:  # BCC raises bare Exception for load/attach failures
        return Finding(name, False, f"{type(exc).__name__}: {exc}".splitlines()[0][:160], fix, required)


def check_bcc_tracepoint() -> Finding:
    def build():
        from bcc import BPF
        b = BPF(text=b"TRACEPOINT_PROBE(sched, sched_switch) { return 0; }")
        return b, "BCC compiled and attached tracepoint sched:sched_switch"
    return _try("tracepoint", build, f"{SETUP}; then slotune doctor again", required=True)


def check_raw_tracepoint() -> Finding:
    def build():
        from bcc import BPF
        if not BPF.support_raw_tracepoint():
            raise OSError("kernel has no raw tracepoint support")
        b = BPF(text=b"RAW_TRACEPOINT_PROBE(sched_switch) { return 0; }")
        return b, "raw tracepoint sched_switch attached (slotune reads no structs through it)"
    return _try("raw tracepoint", build, "needs Linux >= 4.17; slotune works without it")


def check_uprobe() -> Finding:
    def build():
        from bcc import BPF
        b = BPF(text=b"int on_call(void *ctx) { return 0; }")
        b.attach_uprobe(name="c", sym="getpid", fn_name="on_call", pid=os.getpid())
        return b, "uprobe on libc getpid attached (TLS probes on libssl use the same)"
    return _try("uprobe", build, "needs CONFIG_UPROBE_EVENTS=y; TLS probes stay off without it")


def kprobes_configured() -> bool:
    return (TRACEFS / "kprobe_events").exists()


def check_kprobe() -> Finding:
    if not kprobes_configured():
        return Finding("kprobe", False,
                       f"kernel built without CONFIG_KPROBES ({TRACEFS}/kprobe_events absent); "
                       "slotune uses tracepoints instead and loses nothing",
                       "none needed; for kprobe-based tools, boot a kernel with CONFIG_KPROBES=y")

    def build():
        from bcc import BPF
        b = BPF(text=b"int on_call(void *ctx) { return 0; }")
        b.attach_kprobe(event=b.get_syscall_fnname("getpid"), fn_name="on_call")
        return b, "kprobe on getpid attached"
    return _try("kprobe", build, "check dmesg; slotune uses tracepoints and loses nothing")


def lockdown_mode() -> str | None:
    path = Path("/sys/kernel/security/lockdown")
    if not path.exists():
        return None
    m = re.search(r"\[(\w+)\]", path.read_text())
    return m.group(1) if m else None


def check_fentry() -> Finding:
    def build():
        from bcc import BPF
        if not BPF.support_kfunc():
            raise OSError("kernel has no BPF trampoline support")
        b = BPF(text=b"KFUNC_PROBE(vfs_read) { return 0; }")
        return b, "fentry on vfs_read attached"
    found = _try("fentry", build, "none needed; slotune uses tracepoints and loses nothing")
    # BCC turns the kernel's EPERM into "Need super-user privileges", even as root.
    if found.ok or not any(s in found.detail for s in ("super-user", "not permitted", "EPERM")):
        return found
    mode = lockdown_mode() or "integrity (securityfs not mounted, inferred from EPERM as root)"
    return Finding("fentry", False, f"refused with EPERM: kernel lockdown {mode}; slotune uses tracepoints instead",
                   "none needed; to allow fentry, boot with lockdown=none (lockdown cannot be lowered at run time)")


def check_memlock() -> Finding:
    """RLIMIT_MEMLOCK only matters before 5.11 (memcg accounting); never fatal."""
    import resource
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    found = re.match(r"(\d+)\.(\d+)", platform.release())
    major, minor = (int(x) for x in found.groups()) if found else (0, 0)
    if (major, minor) >= (5, 11) or soft == resource.RLIM_INFINITY:
        return Finding("BPF memory", True, "kernel >= 5.11 charges BPF maps to the cgroup; RLIMIT_MEMLOCK irrelevant")
    return Finding("BPF memory", False, f"RLIMIT_MEMLOCK {soft} bytes on a pre-5.11 kernel",
                   "LimitMEMLOCK=infinity in the unit, or ulimit -l unlimited")

