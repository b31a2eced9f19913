"""One GPU as NVML shows it: reads every field once per sweep into a
GpuReading in base units, skips what this GPU does not support (once, with a
log line) and raises GpuLost when the GPU has fallen off the bus."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable

import pynvml

log = logging.getLogger("slotune.nvml")

# Errors that mean "this GPU or driver will never answer this call": skip the field for good.
# (pynvml raises NVMLLibraryMismatchError when a driver older than it lacks a versioned call.)
NEVER_ANSWERS = (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound,
                 pynvml.NVMLError_NoPermission, pynvml.NVMLLibraryMismatchError)

# Clock-event (throttle) reasons, one flag each, named as users read them.
CLOCK_EVENT_REASONS = {
    "gpu_idle": pynvml.nvmlClocksEventReasonGpuIdle,
    "applications_clocks_setting": pynvml.nvmlClocksEventReasonApplicationsClocksSetting,
    "sw_power_cap": pynvml.nvmlClocksEventReasonSwPowerCap,
    "hw_slowdown": pynvml.nvmlClocksEventReasonHwSlowdown,
    "sync_boost": pynvml.nvmlClocksEventReasonSyncBoost,
    "sw_thermal_slowdown": pynvml.nvmlClocksEventReasonSwThermalSlowdown,
    "hw_thermal_slowdown": pynvml.nvmlClocksEventReasonHwThermalSlowdown,
    "hw_power_brake_slowdown": pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown,
    "display_clock_setting": pynvml.nvmlClocksEventReasonDisplayClockSetting,
}
# The reasons that slow a busy GPU down (idle and the operator's own clock settings do not count).
THROTTLING_REASONS = ("sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown",
                      "hw_power_brake_slowdown")

# Usable bytes/s per lane and direction for each PCIe generation (after line encoding).
PCIE_LANE_BYTES_PER_S = {1: 250e6, 2: 500e6, 3: 984.6e6, 4: 1969.2e6, 5: 3938.5e6, 6: 7563e6}


class GpuLost(Exception):
    """The GPU stopped answering (NVML_ERROR_GPU_IS_LOST or XID 79)."""


@dataclass
class ProcessUse:
    memory_bytes: float | None  # None: the driver does not tell (e.g. no permission)
    utilization_ratio: float | None = None  # SM share over the last interval, where supported


@dataclass
class GpuReading:
    """One GPU at one sweep; absent keys were not supported or not readable."""
    index: int
    uuid: str
    name: str
    up: bool = True
    values: dict[str, float] = field(default_factory=dict)
    clock_events: dict[str, int] = field(default_factory=dict)
    ecc_errors: dict[str, float] = field(default_factory=dict)      # corrected / uncorrected
    remapped_rows: dict[str, float] = field(default_factory=dict)   # correctable / uncorrectable
    processes: dict[int, ProcessUse] = field(default_factory=dict)  # host PID -> use; never exported
    per_process_utilization: bool = False

    @property
    def throttled(self) -> bool:
        return any(self.clock_events.get(reason) for reason in THROTTLING_REASONS)


def text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class GpuDevice:
    """Holds one GPU's handle and what it has learned about it (unsupported fields,
    GPM samples, the last per-process utilisation timestamp) between sweeps."""

    def __init__(self, nvml, index: int, report_skip: Callable[[str, "GpuDevice", Exception], None]):
        self.nvml = nvml
        self.index = index
        self.report_skip = report_skip
        self.skipped: set[str] = set()
        self.lost_reason: str | None = None
        self.handle = nvml.nvmlDeviceGetHandleByIndex(index)
        self.uuid = text(nvml.nvmlDeviceGetUUID(self.handle))
        self.name = text(nvml.nvmlDeviceGetName(self.handle))
        self.last_utilization_us = 0
        self.pcie_bytes_per_s = self._pcie_capacity()
        self.gpm_samples = self._gpm_samples()
        self.gpm_primed = False

    def __str__(self) -> str:
        return f"GPU {self.index} ({self.name}, {self.uuid})"

    def call(self, field_name: str, fn, *args):
        """One NVML call for one field: None when skipped; GpuLost when the GPU is gone."""
        if field_name in self.skipped:
            return None
        try:
            return fn(self.handle, *args)
        except pynvml.NVMLError_GpuIsLost as exc:
            raise GpuLost(str(exc)) from exc
        except NEVER_ANSWERS as exc:
            self.skipped.add(field_name)
            self.report_skip(field_name, self, exc)
        except pynvml.NVMLError as exc:  # transient (Unknown, Timeout...): this sweep only
            self.report_skip(field_name, self, exc)
        return None

    def _pcie_capacity(self) -> float | None:
        gen = self.call("pcie_link", self.nvml.nvmlDeviceGetMaxPcieLinkGeneration)
        width = self.call("pcie_link", self.nvml.nvmlDeviceGetMaxPcieLinkWidth)
        if gen in PCIE_LANE_BYTES_PER_S and width:
            return PCIE_LANE_BYTES_PER_S[gen] * width
        return None

    def _gpm_samples(self):
        support = self.call("dram_bandwidth", self.nvml.nvmlGpmQueryDeviceSupport)
        if support is None or not support.isSupportedDevice:
            if support is not None:
                self.report_skip("dram_bandwidth", self, RuntimeError("no GPM on this GPU (Hopper or newer has it)"))
            self.skipped.add("dram_bandwidth")
            return None
        return [self.nvml.nvmlGpmSampleAlloc(), self.nvml.nvmlGpmSampleAlloc()]

    def close(self) -> None:
        samples, self.gpm_samples = self.gpm_samples, None
        for sample in samples or ():
            try:
                self.nvml.nvmlGpmSampleFree(sample)
            except pynvml.NVMLError:
                pass  # the GPU or the library is already gone; nothing left to free

    def mark_lost(self, reason: str) -> None:
        if self.lost_reason is None:
            self.lost_reason = reason
            log.error("nvml: %s lost (%s): its metrics stop, the other GPUs go on; "
                      "fix: check dmesg for XID 79, then reset (nvidia-smi -r) or reseat the GPU", self, reason)

    def read(self) -> GpuReading:
        reading = GpuReading(self.index, self.uuid, self.name)
        if self.lost_reason is not None:
            reading.up = False
            return reading
        try:
            self._read_into(reading)
        except GpuLost as exc:
            self.mark_lost(str(exc))
            return GpuReading(self.index, self.uuid, self.name, up=False)
        return reading

    def _read_into(self, r: GpuReading) -> None:
        n, v = self.nvml, r.values
        util = self.call("utilization", n.nvmlDeviceGetUtilizationRates)
        if util is not None:
            v["utilization_ratio"] = util.gpu / 100
            v["memory_copy_utilization_ratio"] = util.memory / 100
        memory = self.call("framebuffer", n.nvmlDeviceGetMemoryInfo)
        if memory is not None:
            v["framebuffer_used_bytes"], v["framebuffer_free_bytes"] = memory.used, memory.free
            v["framebuffer_total_bytes"] = memory.total
        for direction, counter in (("tx", pynvml.NVML_PCIE_UTIL_TX_BYTES), ("rx", pynvml.NVML_PCIE_UTIL_RX_BYTES)):
            kib_per_s = self.call(f"pcie_{direction}", n.nvmlDeviceGetPcieThroughput, counter)
            if kib_per_s is not None:
                v[f"pcie_{direction}_bytes_per_second"] = kib_per_s * 1024
        for clock, which in (("sm_clock_hertz", pynvml.NVML_CLOCK_SM), ("memory_clock_hertz", pynvml.NVML_CLOCK_MEM)):
            mhz = self.call(clock, n.nvmlDeviceGetClockInfo, which)
            if mhz is not None:
                v[clock] = mhz * 1e6
        reasons = self.call("clock_events", n.nvmlDeviceGetCurrentClocksEventReasons)
        if reasons is not None:
            r.clock_events = {name: int(bool(reasons & bit)) for name, bit in CLOCK_EVENT_REASONS.items()}
        for key, fn, scale in (("power_watts", n.nvmlDeviceGetPowerUsage, 1e-3),
                               ("energy_joules", n.nvmlDeviceGetTotalEnergyConsumption, 1e-3)):
            raw = self.call(key, fn)
            if raw is not None:
                v[key] = raw * scale
        temperature = self.call("temperature", n.nvmlDeviceGetTemperature, pynvml.NVML_TEMPERATURE_GPU)
        if temperature is not None:
            v["temperature_celsius"] = temperature
        for kind, which in (("corrected", pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
                            ("uncorrected", pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)):
            count = self.call("ecc_errors", n.nvmlDeviceGetTotalEccErrors, which, pynvml.NVML_VOLATILE_ECC)
            if count is not None:
                r.ecc_errors[kind] = count
        rows = self.call("remapped_rows", n.nvmlDeviceGetRemappedRows)
        if rows is not None:
            correctable, uncorrectable, pending, failed = rows
            r.remapped_rows = {"correctable": correctable, "uncorrectable": uncorrectable}
            v["row_remap_pending"], v["row_remap_failed"] = int(bool(pending)), int(bool(failed))
        if self.pcie_bytes_per_s and ("pcie_tx_bytes_per_second" in v or "pcie_rx_bytes_per_second" in v):
            busiest = max(v.get("pcie_tx_bytes_per_second", 0), v.get("pcie_rx_bytes_per_second", 0))
            v["pcie_ratio"] = min(1.0, busiest / self.pcie_bytes_per_s)
        dram = self._dram_bandwidth()
        if dram is not None:
            v["dram_bandwidth_utilization_ratio"] = dram
        r.processes = self._processes()
        shares = self._process_utilization()
        r.per_process_utilization = shares is not None
        for pid, share in (shares or {}).items():
            if pid in r.processes:
                r.processes[pid].utilization_ratio = share

    def _dram_bandwidth(self) -> float | None:
        """DRAM bandwidth use between the previous sweep and this one (GPM, Hopper+)."""
        if self.gpm_samples is None:
            return None
        previous, current = self.gpm_samples
        if self.call("dram_bandwidth", self.nvml.nvmlGpmSampleGet, current) is None:
            return None
        self.gpm_samples = [current, previous]
        if not self.gpm_primed:
            self.gpm_primed = True
            return None
        query = pynvml.c_nvmlGpmMetricsGet_t()
        query.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        query.numMetrics = 1
        query.sample1, query.sample2 = previous, current
        query.metrics[0].metricId = pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL
        try:
            self.nvml.nvmlGpmMetricsGet(query)
        except pynvml.NVMLError as exc:
            self.report_skip("dram_bandwidth", self, exc)
            return None
        metric = query.metrics[0]
        return metric.value / 100 if metric.nvmlReturn == pynvml.NVML_SUCCESS else None

    def _processes(self) -> dict[int, ProcessUse]:
        found: dict[int, ProcessUse] = {}
        for kind, fn in (("compute_processes", self.nvml.nvmlDeviceGetComputeRunningProcesses),
                         ("graphics_processes", self.nvml.nvmlDeviceGetGraphicsRunningProcesses)):
            for proc in self.call(kind, fn) or ():
                seen = found.get(proc.pid)
                memory = proc.usedGpuMemory
                if seen is not None and seen.memory_bytes is not None:  # in both lists: same memory
                    memory = max(memory or 0, seen.memory_bytes)
                found[proc.pid] = ProcessUse(memory)
        return found

    def _process_utilization(self) -> dict[int, float] | None:
        """pid -> mean SM share since the last sweep; None when this GPU cannot tell."""
        def samples(handle):
            try:
                return self.nvml.nvmlDeviceGetProcessUtilization(handle, self.last_utilization_us)
            except pynvml.NVMLError_NotFound:
                return []  # no process ran a kernel since the last sweep
            except pynvml.NVMLError as exc:
                if exc.value == pynvml.NVML_SUCCESS:  # pynvml raises this when the count is 0
                    return []
                raise
        got = self.call("process_utilization", samples)
        if got is None:
            return None
        by_pid: dict[int, list[float]] = {}
        for sample in got:
            by_pid.setdefault(sample.pid, []).append(sample.smUtil / 100)
            self.last_utilization_us = max(self.last_utilization_us, sample.timeStamp)
        return {pid: sum(shares) / len(shares) for pid, shares in by_pid.items()}
