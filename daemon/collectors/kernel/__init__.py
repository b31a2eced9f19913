"""Kernel probes (bpf/*.bpf.c) as a collector: one small class per probe family,
found in families/, one BPF object for all of them, per-service Samples each interval."""
from slotune.collectors.kernel.collector import KernelCollector  # noqa: F401
from slotune.collectors.kernel.families import FAMILIES, make_families  # noqa: F401
