"""The GPU collector: one NVML sweep of every GPU per interval, XID errors from
an NVML event set, and each service's share of the GPUs its processes use (by
host PID, never exported per PID). Without a driver or GPU it says so once and
stays down (`up` False, collect() returns [])."""
from __future__ import annotations

import ctypes
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import pynvml

from slotune.model.sample import Sample
from slotune.collectors.gpu.device import GpuDevice, GpuReading, log, text
from slotune.export.samples import register_signals
from slotune.model.service import ServiceSpec

XID_GPU_FELL_OFF_THE_BUS = 79
MAX_EVENTS_PER_SWEEP = 1000  # an XID storm cannot stall a sweep
NO_GPU_FIX = "check nvidia-smi; in a container pass the GPUs through (--gpus all)"

# The Sample gauges of each service (worst GPU among those its processes use): what the
# attribution and the batch tuner read, exported per service by the SampleExporter.
register_signals({
    "gpu_memory_bytes": ("slotune_service_gpu_memory_bytes", None, "gauge",
                         "Device memory held by the service's processes, all GPUs"),
    "gpu_utilization_ratio": ("slotune_service_gpu_utilization_ratio", None, "gauge",
                              "The service's share of its busiest GPU"),
    "gpu_saturation_ratio": ("slotune_service_gpu_saturation_ratio", None, "gauge",
                             "Utilisation of the busiest GPU the service uses (all processes)"),
    "gpu_membw_ratio": ("slotune_service_gpu_memory_bandwidth_ratio", None, "gauge",
                        "DRAM bandwidth use (GPM; else memory-copy utilisation) of the service's busiest GPU"),
    "gpu_pcie_ratio": ("slotune_service_gpu_pcie_ratio", None, "gauge",
                       "PCIe traffic over link capacity, busiest direction, of the service's GPUs"),
    "gpu_throttled": ("slotune_service_gpu_throttled", None, "gauge",
                      "1 while a GPU the service uses has its clocks held down (power, thermal, slowdown)"),
    "gpu_headroom_ratio": ("slotune_service_gpu_headroom_ratio", None, "gauge",
                           "min(1 - utilisation, free memory share) of the service's tightest GPU"),
})


@dataclass
class ServiceGpuUse:
    """What one service's processes use of one GPU."""
    memory_bytes: float
    utilization_ratio: float | None


@dataclass
class Sweep:
    """Everything one sweep saw; the exporter reads the latest without calling NVML."""
    gpus: list[GpuReading] = field(default_factory=list)
    services: dict[str, dict[int, ServiceGpuUse]] = field(default_factory=dict)  # service -> gpu index -> use
    xid_errors: Counter = field(default_factory=Counter)  # (gpu index, uuid, xid) -> count since start


def explain_failure(exc: Exception) -> tuple[str, str]:
    """(what is wrong, how to fix it) for an NVML start-up failure, in users' words."""
    if isinstance(exc, pynvml.NVMLError_LibraryNotFound):
        return ("no NVIDIA driver or GPU (NVML Shared Library Not Found: libnvidia-ml.so.1); "
                "GPU signals stay off, everything else runs",
                "on a GPU host install the NVIDIA driver (libnvidia-ml.so.1); elsewhere nothing to do")
    if isinstance(exc, pynvml.NVMLError_DriverNotLoaded):
        return ("NVIDIA driver installed but its kernel module is not loaded; GPU signals stay off",
                "modprobe nvidia (or reboot after the driver install), then check nvidia-smi and dmesg")
    if isinstance(exc, pynvml.NVMLError_NoPermission):
        return ("no permission to open the GPU devices; GPU signals stay off",
                "run the daemon as root or give it read access to /dev/nvidia*")
    if isinstance(exc, pynvml.NVMLError_LibRmVersionMismatch):
        return ("NVML library and loaded NVIDIA kernel module differ in version; GPU signals stay off",
                "reboot (or reload the nvidia module) after the driver upgrade")
    return (f"NVML failed to start ({type(exc).__name__}: {exc}); GPU signals stay off",
            "check nvidia-smi and dmesg on this host")


def probe(nvml=pynvml) -> tuple[bool, str, str]:
    """For `slotune doctor`: (ok, detail, fix) after one init / look / shutdown."""
    try:
        nvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return (False, *explain_failure(exc))
    try:
        driver = text(nvml.nvmlSystemGetDriverVersion())
        count = nvml.nvmlDeviceGetCount()
        if count == 0:
            return False, f"driver {driver} loaded but no GPU visible; GPU signals stay off", NO_GPU_FIX
        names = sorted({text(nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(i))) for i in range(count)})
        return True, f"driver {driver}, {count} GPU(s): {', '.join(names)}", ""
    except pynvml.NVMLError as exc:
        return False, f"NVML started but cannot list the GPUs ({exc}); GPU signals stay off", NO_GPU_FIX
    finally:
        nvml.nvmlShutdown()


def handle_key(handle) -> int:
    """A stable key for an NVML device handle (a ctypes pointer; any object in the fake)."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value or id(handle)
    except (TypeError, ctypes.ArgumentError):
        return id(handle)


class NvmlCollector:
    """Collector protocol (slotune.collectors.base) over NVML.

    pids_of(service name) -> host PIDs comes from the daemon's service targeting;
    nvml is the NVML binding (pynvml; tests pass a stand-in because no GPU exists there)."""

    name = "nvml"

    def __init__(self, pids_of: Callable[[str], set[int]], nvml=pynvml):
        self.pids_of = pids_of
        self.nvml = nvml
        self.services: list[ServiceSpec] = []
        self.devices: list[GpuDevice] = []
        self.latest = Sweep()
        self.problem: str | None = None  # why the collector is down, for doctor/status
        self._up = False
        self._events = None
        self._xid_errors: Counter = Counter()
        self._reported: set[str] = set()

    exports_samples = True

    @property
    def up(self) -> bool:
        return self._up

    def parts(self) -> dict[str, bool]:
        return {}

    def metric_families(self):
        from slotune.collectors.gpu.metrics import GpuMetrics   # it reads this collector
        return (GpuMetrics(self),)

    def start(self, services: list[ServiceSpec]) -> None:
        self.services = list(services)
        try:
            self.nvml.nvmlInit()
        except pynvml.NVMLError as exc:
            self._down(*explain_failure(exc))
            return
        try:
            count = self.nvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as exc:
            self.nvml.nvmlShutdown()
            self._down(f"NVML started but cannot count the GPUs ({exc})", NO_GPU_FIX)
            return
        for index in range(count):
            try:
                self.devices.append(GpuDevice(self.nvml, index, self._report_skip))
            except pynvml.NVMLError as exc:
                log.error("nvml: GPU %d cannot be opened (%s): left out, the other GPUs go on; "
                          "fix: check nvidia-smi and dmesg", index, exc)
        if not self.devices:
            self.nvml.nvmlShutdown()
            self._down(f"driver loaded but no usable GPU ({count} seen)", NO_GPU_FIX)
            return
        self._register_xid_events()
        self._up = True
        log.info("nvml: watching %s", ", ".join(str(d) for d in self.devices))

    def update_services(self, services: list[ServiceSpec]) -> None:
        self.services = list(services)

    def collect(self, start: float, end: float) -> list[Sample]:
        if not self._up:
            return []
        sweep = self.sweep()
        return [self._sample(spec.name, sweep, start, end) for spec in self.services]

    def sweep(self) -> Sweep:
        """Read XID events, then every GPU once, then map processes to services."""
        self._drain_xid_events()
        readings = [device.read() for device in self.devices]
        services = {spec.name: self._service_use(self.pids_of(spec.name), readings) for spec in self.services}
        self.latest = Sweep(readings, services, Counter(self._xid_errors))
        return self.latest

    def close(self) -> None:
        if not self._up:
            return
        self._up = False
        for device in self.devices:
            device.close()
        if self._events is not None:
            try:
                self.nvml.nvmlEventSetFree(self._events)
            except pynvml.NVMLError:
                pass  # the driver is going away with us; nothing left to free
            self._events = None
        self.nvml.nvmlShutdown()

    # --- start-up and reporting ---------------------------------------------

    def _down(self, detail: str, fix: str) -> None:
        self.problem = detail
        log.warning("nvml: %s; fix: %s", detail, fix)

    def _report_skip(self, field_name: str, device: GpuDevice, exc: Exception) -> None:
        """Each field that a GPU cannot give is listed once in the log, then skipped."""
        self._log_once(f"{field_name}:{type(exc).__name__}", "nvml: %s not available on %s (%s): skipped",
                       field_name, device, exc)

    def _log_once(self, key: str, message: str, *args) -> None:
        if key not in self._reported:
            self._reported.add(key)
            log.info(message, *args)

    def _register_xid_events(self) -> None:
        try:
            self._events = self.nvml.nvmlEventSetCreate()
        except pynvml.NVMLError as exc:
            log.info("nvml: no event set (%s): XID errors are not counted", exc)
            return
        for device in self.devices:
            try:
                self.nvml.nvmlDeviceRegisterEvents(device.handle, pynvml.nvmlEventTypeXidCriticalError, self._events)
            except pynvml.NVMLError as exc:
                self._report_skip("xid_events", device, exc)

    def _drain_xid_events(self) -> None:
        """Take every XID event queued since the last sweep (wait with timeout 0)."""
        if self._events is None:
            return
        by_handle = {handle_key(d.handle): d for d in self.devices}
        for _ in range(MAX_EVENTS_PER_SWEEP):
            try:
                event = self.nvml.nvmlEventSetWait(self._events, 0)
            except pynvml.NVMLError_Timeout:
                return
            except pynvml.NVMLError as exc:  # GPU lost or the like: the GPU reads below find out which
                self._log_once(f"xid_wait:{type(exc).__name__}", "nvml: waiting for XID events failed (%s); "
                               "trying again next sweep", exc)
                return
            if not event.eventType & pynvml.nvmlEventTypeXidCriticalError:
                continue
            device = by_handle.get(handle_key(event.device))
            if device is None:
                continue
            xid = int(event.eventData)
            self._xid_errors[(device.index, device.uuid, xid)] += 1
            log.warning("nvml: %s reported XID %d", device, xid)
            if xid == XID_GPU_FELL_OFF_THE_BUS:
                device.mark_lost(f"XID {xid}: fell off the bus")

    # --- services -------------------------------------------------------------

    @staticmethod
    def _service_use(pids: set[int], readings: list[GpuReading]) -> dict[int, ServiceGpuUse]:
        """Sum memory (and SM share, where the driver tells it) over the service's PIDs, per GPU."""
        use = {}
        for gpu in readings:
            mine = pids & gpu.processes.keys() if gpu.up else set()
            if not mine:
                continue
            memory = sum(gpu.processes[pid].memory_bytes or 0 for pid in mine)
            utilization: float | None
            if gpu.per_process_utilization:
                utilization = min(1.0, sum(gpu.processes[pid].utilization_ratio or 0.0 for pid in mine))
            else:  # the GPU's own utilisation stands in for the service's
                utilization = gpu.values.get("utilization_ratio")
            use[gpu.index] = ServiceGpuUse(memory, utilization)
        return use

    def _sample(self, service: str, sweep: Sweep, start: float, end: float) -> Sample:
        use = sweep.services.get(service, {})
        gauges = {("gpu_memory_bytes", ""): float(sum(u.memory_bytes for u in use.values())),
                  ("gpu_utilization_ratio", ""): max((u.utilization_ratio or 0.0 for u in use.values()), default=0.0)}
        gpus = [g for g in sweep.gpus if g.index in use and g.up]
        if gpus:
            gauges.update(gpu_cause_signals(gpus))
        return Sample(service, self.name, start, end, gauges=gauges)


def gpu_cause_signals(gpus: list[GpuReading]) -> dict[tuple[str, str], float]:
    """GPU-wide signals over the GPUs a service uses (the worst GPU counts): the
    attribution's GPU causes and the batch tuner's headroom."""
    def worst(*keys: str) -> float:
        """The highest value over the GPUs, each GPU giving the first of `keys` it has."""
        return max(next((g.values[k] for k in keys if k in g.values), 0.0) for g in gpus)
    saturation = worst("utilization_ratio")
    memory_free = min((g.values["framebuffer_free_bytes"] / g.values["framebuffer_total_bytes"]
                       for g in gpus if g.values.get("framebuffer_total_bytes")), default=1.0)
    return {
        ("gpu_saturation_ratio", ""): saturation,
        # GPM DRAM bandwidth where the GPU has it; else the memory-copy utilisation as a proxy.
        ("gpu_membw_ratio", ""): worst("dram_bandwidth_utilization_ratio", "memory_copy_utilization_ratio"),
        ("gpu_pcie_ratio", ""): worst("pcie_ratio"),
        ("gpu_throttled", ""): float(any(g.throttled for g in gpus)),
        ("gpu_headroom_ratio", ""): max(0.0, min(1.0 - saturation, memory_free)),
    }
