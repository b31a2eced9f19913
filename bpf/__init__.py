"""The eBPF programs slotune loads, one concern per `*.bpf.c` file beside this one."""
from pathlib import Path

HERE = Path(__file__).resolve().parent


def source(name: str) -> str:
    """Text of `bpf/<name>.bpf.c`, e.g. source("runqueue")."""
    path = HERE / f"{name}.bpf.c"
    if not path.exists():
        known = ", ".join(sorted(p.name[: -len(".bpf.c")] for p in HERE.glob("*.bpf.c")))
        raise FileNotFoundError(f"no BPF program {path}; known programs: {known or 'none'}")
    return path.read_text()


def header(name: str) -> str:
    """Text of `bpf/<name>.h`, e.g. header("common")."""
    path = HERE / f"{name}.h"
    if not path.exists():
        raise FileNotFoundError(f"no BPF header {path}")
    return path.read_text()
