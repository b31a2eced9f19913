"""Prometheus export of the GPU collector: slotune_gpu_* families built at scrape
time from the latest sweep (no NVML call on the scrape path), labelled by gpu
index and uuid, per service by service and gpu, never per PID. (Each service's
Sample rollups, slotune_service_gpu_*, go out through slotune.export.samples.)"""
from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily


GPU_LABELS = ["gpu", "uuid"]

# GpuReading.values key -> (metric name, help); only what the GPU gave is exported.
GAUGES = {
    "utilization_ratio": ("slotune_gpu_utilization_ratio",
                          "Share of the last sample period in which a kernel ran on the GPU"),
    "memory_copy_utilization_ratio": ("slotune_gpu_memory_copy_utilization_ratio",
                                      "Share of the last sample period in which device memory was read or written"),
    "dram_bandwidth_utilization_ratio": ("slotune_gpu_dram_bandwidth_utilization_ratio",
                                         "DRAM bandwidth used over the theoretical peak since the last sweep (GPM)"),
    "framebuffer_used_bytes": ("slotune_gpu_framebuffer_used_bytes", "Device memory in use"),
    "framebuffer_free_bytes": ("slotune_gpu_framebuffer_free_bytes", "Device memory free"),
    "pcie_tx_bytes_per_second": ("slotune_gpu_pcie_tx_bytes_per_second", "PCIe traffic sent by the GPU"),
    "pcie_rx_bytes_per_second": ("slotune_gpu_pcie_rx_bytes_per_second", "PCIe traffic received by the GPU"),
    "sm_clock_hertz": ("slotune_gpu_sm_clock_hertz", "Current SM clock"),
    "memory_clock_hertz": ("slotune_gpu_memory_clock_hertz", "Current memory clock"),
    "power_watts": ("slotune_gpu_power_watts", "Power draw of the board"),
    "temperature_celsius": ("slotune_gpu_temperature_celsius", "GPU core temperature"),
    "row_remap_pending": ("slotune_gpu_row_remap_pending", "1 when a row remap waits for a GPU reset"),
    "row_remap_failed": ("slotune_gpu_row_remap_failed", "1 when a row remap failed (the GPU needs service)"),
}

class GpuMetrics:
    """A prometheus_client custom collector over an NvmlCollector:
    registry.register(GpuMetrics(nvml_collector)). slotune_collector_up{collector="nvml"}
    comes from slotune.export.samples.SampleExporter.set_collector_up, like every collector's."""

    def __init__(self, collector):
        self.collector = collector

    def describe(self):
        return []  # families depend on what the GPUs support; known only at scrape time

    def collect(self):
        if not self.collector.up:
            return
        sweep = self.collector.latest
        yield from self._per_gpu(sweep)
        yield from self._per_service(sweep)

    @staticmethod
    def _per_gpu(sweep):
        gpu_up = GaugeMetricFamily("slotune_gpu_up", "1 while the GPU answers, 0 once it is lost (XID 79)",
                                   labels=GPU_LABELS)
        gauges = {key: GaugeMetricFamily(name, text, labels=GPU_LABELS) for key, (name, text) in GAUGES.items()}
        clock_events = GaugeMetricFamily("slotune_gpu_clock_event_active",
                                         "1 while this reason holds the clocks down (throttle reasons)",
                                         labels=GPU_LABELS + ["reason"])
        energy = CounterMetricFamily("slotune_gpu_energy_joules", "Energy used since the driver loaded",
                                     labels=GPU_LABELS)
        ecc = CounterMetricFamily("slotune_gpu_ecc_errors", "ECC memory errors since the driver loaded (volatile)",
                                  labels=GPU_LABELS + ["type"])
        rows = GaugeMetricFamily("slotune_gpu_remapped_rows", "Memory rows remapped over the GPU's life",
                                 labels=GPU_LABELS + ["kind"])
        for gpu in sweep.gpus:
            labels = [str(gpu.index), gpu.uuid]
            gpu_up.add_metric(labels, 1.0 if gpu.up else 0.0)
            for key, value in gpu.values.items():
                if key in gauges:
                    gauges[key].add_metric(labels, value)
            if "energy_joules" in gpu.values:
                energy.add_metric(labels, gpu.values["energy_joules"])
            for reason, active in gpu.clock_events.items():
                clock_events.add_metric(labels + [reason], active)
            for kind, count in gpu.ecc_errors.items():
                ecc.add_metric(labels + [kind], count)
            for kind, count in gpu.remapped_rows.items():
                rows.add_metric(labels + [kind], count)
        xid = CounterMetricFamily("slotune_gpu_xid_errors", "XID errors reported by the driver since slotune started",
                                  labels=GPU_LABELS + ["xid"])
        for (index, uuid, code), count in sorted(sweep.xid_errors.items()):
            xid.add_metric([str(index), uuid, str(code)], count)
        families = [gpu_up, *gauges.values(), clock_events, energy, ecc, rows, xid]
        return [f for f in families if f.samples]

    @staticmethod
    def _per_service(sweep):
        memory = GaugeMetricFamily("slotune_gpu_service_memory_bytes",
                                   "Device memory held by the service's processes", labels=["service", "gpu"])
        utilization = GaugeMetricFamily("slotune_gpu_service_utilization_ratio",
                                        "The service's share of the GPU (its processes' SM share where the driver "
                                        "tells it, else the GPU's utilisation)", labels=["service", "gpu"])
        for service, per_gpu in sorted(sweep.services.items()):
            for index, use in sorted(per_gpu.items()):
                memory.add_metric([service, str(index)], use.memory_bytes)
                if use.utilization_ratio is not None:
                    utilization.add_metric([service, str(index)], use.utilization_ratio)
        return [f for f in (memory, utilization) if f.samples]
