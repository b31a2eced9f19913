"""Kernel probes (bpf/*.bpf.c) as a collector: one small class per probe family,
one BPF object for all of them, per-service Samples each interval."""
from daemon.collectors.kernel.collector import FAMILIES, KernelCollector, make_families  # noqa: F401
