"""FakeNvml: a stand-in for the pynvml module, because no GPU (and no NVIDIA
driver) exists on the machines these tests run on. It answers the NVML calls
the collector makes with pynvml's own structures, units (KB/s, MHz, mW, mJ, %)
and error classes, so the collector's sweep, export and service mapping run
unchanged. Real-driver behaviour is checked by bench/gpu_check.sh on a GPU host."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace

import pynvml

GIB = 1 << 30


@dataclass(eq=False)
class FakeGpu:
    """One GPU's readings in NVML's own units; also serves as its device handle."""
    uuid: str
    name: str = "NVIDIA H200"
    util_pct: int = 50
    memory_copy_pct: int = 20
    total_bytes: int = 140 * GIB
    used_bytes: int = 40 * GIB
    pcie_tx_kib_s: int = 1000
    pcie_rx_kib_s: int = 2000
    pcie_gen: int = 5
    pcie_width: int = 16
    sm_mhz: int = 1980
    mem_mhz: int = 2619
    clock_event_mask: int = 0
    power_mw: int = 350_000
    energy_mj: int = 9_000_000
    temperature_c: int = 55
    ecc: tuple[int, int] = (3, 0)  # corrected, uncorrected
    remapped_rows: tuple[int, int, int, int] = (2, 0, 0, 0)
    dram_pct: float | None = 61.5  # None: no GPM (pre-Hopper)
    processes: dict[int, int] = field(default_factory=dict)  # pid -> used bytes (compute)
    process_sm_pct: dict[int, list[int]] = field(default_factory=dict)  # pid -> samples since last read
    unsupported: set[str] = field(default_factory=set)  # nvml function names that answer NotSupported
    lost: bool = False


class FakeNvml:
    """Module-shaped: NvmlCollector(pids_of=..., nvml=FakeNvml([...]))."""

    def __init__(self, gpus: list[FakeGpu], driver: str = "570.86.15"):
        self.gpus = gpus
        self.driver = driver
        self.calls: Counter = Counter()
        self.event_waits: list[int] = []  # the timeout of every nvmlEventSetWait
        self.pending_xids: list[tuple[FakeGpu, int]] = []
        self.initialised = 0
        self.clock_us = 1_000_000
        self.last_gpm_sampled: FakeGpu | None = None

    def __getattr__(self, name):
        raise AttributeError(f"FakeNvml has no {name}: add it when the collector starts calling it")

    def _answer(self, fn: str, handle: FakeGpu):
        self.calls[fn] += 1
        if handle.lost:
            raise pynvml.NVMLError_GpuIsLost()
        if fn in handle.unsupported:
            raise pynvml.NVMLError_NotSupported()
        return handle

    # --- library -------------------------------------------------------------
    def nvmlInit(self):
        self.initialised += 1

    def nvmlShutdown(self):
        self.initialised -= 1

    def nvmlSystemGetDriverVersion(self):
        return self.driver

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        return self.gpus[index]

    def nvmlDeviceGetUUID(self, h):
        return self._answer("nvmlDeviceGetUUID", h).uuid

    def nvmlDeviceGetName(self, h):
        return self._answer("nvmlDeviceGetName", h).name

    # --- per-GPU fields ----------------------------------------------------------
    def nvmlDeviceGetMaxPcieLinkGeneration(self, h):
        return self._answer("nvmlDeviceGetMaxPcieLinkGeneration", h).pcie_gen

    def nvmlDeviceGetMaxPcieLinkWidth(self, h):
        return self._answer("nvmlDeviceGetMaxPcieLinkWidth", h).pcie_width

    def nvmlDeviceGetUtilizationRates(self, h):
        g = self._answer("nvmlDeviceGetUtilizationRates", h)
        return pynvml.c_nvmlUtilization_t(gpu=g.util_pct, memory=g.memory_copy_pct)

    def nvmlDeviceGetMemoryInfo(self, h):
        g = self._answer("nvmlDeviceGetMemoryInfo", h)
        return pynvml.c_nvmlMemory_t(total=g.total_bytes, free=g.total_bytes - g.used_bytes, used=g.used_bytes)

    def nvmlDeviceGetPcieThroughput(self, h, counter):
        g = self._answer("nvmlDeviceGetPcieThroughput", h)
        return g.pcie_tx_kib_s if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES else g.pcie_rx_kib_s

    def nvmlDeviceGetClockInfo(self, h, which):
        g = self._answer("nvmlDeviceGetClockInfo", h)
        return g.sm_mhz if which == pynvml.NVML_CLOCK_SM else g.mem_mhz

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return self._answer("nvmlDeviceGetCurrentClocksEventReasons", h).clock_event_mask

    def nvmlDeviceGetPowerUsage(self, h):
        return self._answer("nvmlDeviceGetPowerUsage", h).power_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        return self._answer("nvmlDeviceGetTotalEnergyConsumption", h).energy_mj

    def nvmlDeviceGetTemperature(self, h, sensor):
        return self._answer("nvmlDeviceGetTemperature", h).temperature_c

    def nvmlDeviceGetTotalEccErrors(self, h, error_type, counter_type):
        return self._answer("nvmlDeviceGetTotalEccErrors", h).ecc[error_type]

    def nvmlDeviceGetRemappedRows(self, h):
        return self._answer("nvmlDeviceGetRemappedRows", h).remapped_rows

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        g = self._answer("nvmlDeviceGetComputeRunningProcesses", h)
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in g.processes.items()]

    def nvmlDeviceGetGraphicsRunningProcesses(self, h):
        self._answer("nvmlDeviceGetGraphicsRunningProcesses", h)
        return []

    def nvmlDeviceGetProcessUtilization(self, h, last_seen_us):
        g = self._answer("nvmlDeviceGetProcessUtilization", h)
        self.clock_us += 1000
        samples = [pynvml.c_nvmlProcessUtilizationSample_t(pid=pid, timeStamp=self.clock_us, smUtil=pct)
                   for pid, pcts in g.process_sm_pct.items() for pct in pcts]
        g.process_sm_pct = {}
        if not samples:
            raise pynvml.NVMLError_NotFound()
        return samples

    # --- GPM (Hopper and newer) --------------------------------------------------
    def nvmlGpmQueryDeviceSupport(self, h):
        g = self._answer("nvmlGpmQueryDeviceSupport", h)
        return pynvml.c_nvmlGpmSupport_t(version=1, isSupportedDevice=int(g.dram_pct is not None))

    def nvmlGpmSampleAlloc(self):
        self.calls["nvmlGpmSampleAlloc"] += 1
        return pynvml.c_nvmlGpmSample_t()

    def nvmlGpmSampleFree(self, sample):
        self.calls["nvmlGpmSampleFree"] += 1

    def nvmlGpmSampleGet(self, h, sample):
        self.last_gpm_sampled = self._answer("nvmlGpmSampleGet", h)
        return sample

    def nvmlGpmMetricsGet(self, query):
        """Answers for the GPU sampled last (the collector queries right after sampling)."""
        self.calls["nvmlGpmMetricsGet"] += 1
        query.metrics[0].value = self.last_gpm_sampled.dram_pct
        query.metrics[0].nvmlReturn = pynvml.NVML_SUCCESS
        return query

    # --- XID events --------------------------------------------------------------
    def nvmlEventSetCreate(self):
        return object()

    def nvmlDeviceRegisterEvents(self, h, event_types, event_set):
        self._answer("nvmlDeviceRegisterEvents", h)

    def nvmlEventSetWait(self, event_set, timeout_ms):
        self.event_waits.append(timeout_ms)
        if not self.pending_xids:
            raise pynvml.NVMLError_Timeout()
        gpu, xid = self.pending_xids.pop(0)
        return SimpleNamespace(device=gpu, eventType=pynvml.nvmlEventTypeXidCriticalError, eventData=xid)

    def nvmlEventSetFree(self, event_set):
        self.calls["nvmlEventSetFree"] += 1
