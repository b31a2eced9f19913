"""The GPU collector's sweep, export and service mapping, run against FakeNvml
(a stand-in for the NVIDIA driver, because no GPU exists on these machines)."""
import logging
import subprocess

import pynvml
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from slotune.collectors.gpu.metrics import GpuMetrics
from slotune.collectors.gpu.collector import NvmlCollector
from slotune.export.samples import SampleExporter
from slotune.model.service import ServiceSpec
from tests.gpu.fake_nvml import GIB, FakeGpu, FakeNvml

SERVICES = [ServiceSpec("inference"), ServiceSpec("gateway")]
PIDS = {"inference": {100, 101}, "gateway": {300}}


def started(*gpus: FakeGpu, pids=PIDS) -> tuple[NvmlCollector, FakeNvml]:
    fake = FakeNvml(list(gpus))
    collector = NvmlCollector(pids_of=lambda service: pids.get(service, set()), nvml=fake)
    collector.start(SERVICES)
    assert collector.up
    return collector, fake


def exposition(collector: NvmlCollector, found=()) -> str:
    """The scrape the daemon serves: per-GPU families plus the Samples through the SampleExporter."""
    exporter = SampleExporter()
    exporter.set_collector_up(collector.name, collector.up)
    exporter.observe(list(found))
    registry = CollectorRegistry(auto_describe=True)
    registry.register(GpuMetrics(collector))
    registry.register(exporter)
    return generate_latest(registry).decode()


def samples(text: str) -> dict[tuple, float]:
    """(metric name, sorted label pairs) -> value."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(text: str, name: str, **labels) -> float:
    return samples(text)[(name, tuple(sorted(labels.items())))]


def by_service(found) -> dict:
    return {sample.service: sample for sample in found}


def test_one_sweep_exports_every_gpu_field_in_base_units_and_passes_promtool():
    gpu = FakeGpu("GPU-aaaa", clock_event_mask=pynvml.nvmlClocksEventReasonSwPowerCap, processes={100: GIB})
    collector, _ = started(gpu)
    text = exposition(collector, collector.collect(0.0, 1.0))
    at = dict(gpu="0", uuid="GPU-aaaa")
    assert value(text, "slotune_collector_up", collector="nvml") == 1
    assert value(text, "slotune_gpu_utilization_ratio", **at) == 0.5
    assert value(text, "slotune_gpu_memory_copy_utilization_ratio", **at) == 0.2
    assert value(text, "slotune_gpu_framebuffer_used_bytes", **at) == 40 * GIB
    assert value(text, "slotune_gpu_framebuffer_free_bytes", **at) == 100 * GIB
    assert value(text, "slotune_gpu_pcie_tx_bytes_per_second", **at) == 1000 * 1024
    assert value(text, "slotune_gpu_pcie_rx_bytes_per_second", **at) == 2000 * 1024
    assert value(text, "slotune_gpu_sm_clock_hertz", **at) == 1980e6
    assert value(text, "slotune_gpu_memory_clock_hertz", **at) == 2619e6
    assert value(text, "slotune_gpu_power_watts", **at) == 350
    assert value(text, "slotune_gpu_energy_joules_total", **at) == 9000
    assert value(text, "slotune_gpu_temperature_celsius", **at) == 55
    assert value(text, "slotune_gpu_ecc_errors_total", **at, type="corrected") == 3
    assert value(text, "slotune_gpu_remapped_rows", **at, kind="correctable") == 2
    assert value(text, "slotune_gpu_clock_event_active", **at, reason="sw_power_cap") == 1
    assert value(text, "slotune_gpu_clock_event_active", **at, reason="hw_thermal_slowdown") == 0
    assert value(text, "slotune_service_gpu_throttled", service="inference") == 1
    assert ("slotune_service_gpu_throttled", (("service", "gateway"),)) not in samples(text)  # not on this GPU
    checked = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_dram_bandwidth_comes_from_gpm_between_two_sweeps():
    collector, _ = started(FakeGpu("GPU-aaaa", dram_pct=61.5))
    collector.collect(0.0, 1.0)
    assert "slotune_gpu_dram_bandwidth_utilization_ratio" not in exposition(collector)  # needs two samples
    collector.collect(1.0, 2.0)
    text = exposition(collector)
    assert value(text, "slotune_gpu_dram_bandwidth_utilization_ratio", gpu="0", uuid="GPU-aaaa") == 0.615


def test_unsupported_fields_are_skipped_listed_once_and_not_asked_again(caplog):
    gpu = FakeGpu("GPU-old", dram_pct=None, unsupported={"nvmlDeviceGetPowerUsage", "nvmlDeviceGetRemappedRows"})
    collector, fake = started(gpu)
    with caplog.at_level(logging.INFO, logger="slotune.nvml"):
        for second in range(3):
            collector.collect(second, second + 1.0)
    text = exposition(collector)
    assert "slotune_gpu_power_watts" not in text and "slotune_gpu_remapped_rows" not in text
    assert "slotune_gpu_dram_bandwidth_utilization_ratio" not in text
    assert value(text, "slotune_gpu_temperature_celsius", gpu="0", uuid="GPU-old") == 55
    skipped = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len([m for m in skipped if "power_watts" in m]) == 1
    assert len([m for m in skipped if "remapped_rows" in m]) == 1
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 1
    assert fake.calls["nvmlDeviceGetTemperature"] == 3


def test_a_gpu_lost_mid_run_is_reported_once_and_the_other_goes_on(caplog):
    first, second = FakeGpu("GPU-0000"), FakeGpu("GPU-1111")
    collector, fake = started(first, second)
    collector.collect(0.0, 1.0)
    second.lost = True
    with caplog.at_level(logging.ERROR, logger="slotune.nvml"):
        for s in (1.0, 2.0, 3.0):
            collector.collect(s, s + 1.0)
    text = exposition(collector)
    assert value(text, "slotune_gpu_up", gpu="1", uuid="GPU-1111") == 0
    assert value(text, "slotune_gpu_up", gpu="0", uuid="GPU-0000") == 1
    assert value(text, "slotune_gpu_utilization_ratio", gpu="0", uuid="GPU-0000") == 0.5
    assert ("slotune_gpu_utilization_ratio", (("gpu", "1"), ("uuid", "GPU-1111"))) not in samples(text)
    lost = [r for r in caplog.records if "lost" in r.getMessage()]
    assert len(lost) == 1 and "GPU 1" in lost[0].getMessage()
    assert collector.up


def test_xid_errors_are_counted_from_the_event_set_and_xid_79_takes_the_gpu_out(caplog):
    first, second = FakeGpu("GPU-0000"), FakeGpu("GPU-1111")
    collector, fake = started(first, second)
    fake.pending_xids += [(first, 48), (first, 48), (second, 79)]
    with caplog.at_level(logging.WARNING, logger="slotune.nvml"):
        collector.collect(0.0, 1.0)
    text = exposition(collector)
    assert value(text, "slotune_gpu_xid_errors_total", gpu="0", uuid="GPU-0000", xid="48") == 2
    assert value(text, "slotune_gpu_xid_errors_total", gpu="1", uuid="GPU-1111", xid="79") == 1
    assert value(text, "slotune_gpu_up", gpu="1", uuid="GPU-1111") == 0
    assert fake.calls["nvmlDeviceGetTemperature"] == 1  # the fallen GPU is no longer read
    assert set(fake.event_waits) == {0}, "the event set is polled without waiting"
    assert any("XID 79" in r.getMessage() for r in caplog.records)


def test_service_memory_is_summed_over_its_pids_and_never_labelled_by_pid():
    gpu = FakeGpu("GPU-aaaa", processes={100: 2 * GIB, 101: 1 * GIB, 200: 5 * GIB},
                  process_sm_pct={100: [30, 50], 101: [10], 200: [40]})
    collector, _ = started(gpu)
    found = by_service(collector.collect(0.0, 1.0))
    assert found["inference"].gauges[("gpu_memory_bytes", "")] == 3 * GIB
    assert found["inference"].gauges[("gpu_utilization_ratio", "")] == pytest.approx(0.4 + 0.1)
    assert found["inference"].collector == "nvml" and found["inference"].end == 1.0
    text = exposition(collector, found.values())
    assert value(text, "slotune_gpu_service_memory_bytes", service="inference", gpu="0") == 3 * GIB
    assert value(text, "slotune_service_gpu_memory_bytes", service="inference") == 3 * GIB
    assert value(text, "slotune_gpu_service_utilization_ratio", service="inference", gpu="0") == pytest.approx(0.5)
    label_pairs = [pair for (_, pairs) in samples(text) for pair in pairs]
    assert "pid" not in {k for k, _ in label_pairs}
    assert not {"100", "101", "200"} & {v for _, v in label_pairs}, "a PID leaked into a label"


def test_without_per_process_utilisation_the_service_gets_its_gpus_utilisation():
    gpu = FakeGpu("GPU-aaaa", util_pct=90, processes={100: GIB}, unsupported={"nvmlDeviceGetProcessUtilization"})
    collector, _ = started(gpu)
    found = by_service(collector.collect(0.0, 1.0))
    assert found["inference"].gauges[("gpu_utilization_ratio", "")] == 0.9


def test_gpu_cause_signals_cover_the_service_gpus_only():
    busy = FakeGpu("GPU-busy", util_pct=95, used_bytes=126 * GIB, pcie_tx_kib_s=30_000_000, dram_pct=None,
                   memory_copy_pct=70, clock_event_mask=pynvml.nvmlClocksEventReasonHwThermalSlowdown,
                   processes={100: 10 * GIB})
    quiet = FakeGpu("GPU-quiet", util_pct=5, processes={300: GIB})
    collector, _ = started(busy, quiet)
    found = by_service(collector.collect(0.0, 1.0))
    inference = found["inference"].gauges
    assert inference[("gpu_saturation_ratio", "")] == 0.95
    assert inference[("gpu_membw_ratio", "")] == 0.7  # no GPM: memory-copy utilisation stands in
    assert inference[("gpu_pcie_ratio", "")] == pytest.approx(30_000_000 * 1024 / (3938.5e6 * 16))
    assert inference[("gpu_throttled", "")] == 1
    assert inference[("gpu_headroom_ratio", "")] == pytest.approx(0.05)
    gateway = found["gateway"].gauges
    assert gateway[("gpu_saturation_ratio", "")] == 0.05 and gateway[("gpu_throttled", "")] == 0
    assert gateway[("gpu_headroom_ratio", "")] == pytest.approx(100 / 140)


def test_a_service_on_no_gpu_gets_zero_use_and_no_gpu_causes():
    collector, _ = started(FakeGpu("GPU-aaaa", processes={999: GIB}))
    found = by_service(collector.collect(0.0, 1.0))
    assert found["gateway"].gauges == {("gpu_memory_bytes", ""): 0.0, ("gpu_utilization_ratio", ""): 0.0}


def test_services_can_change_and_close_frees_everything_twice_safely():
    collector, fake = started(FakeGpu("GPU-aaaa"))
    collector.update_services([ServiceSpec("inference")])
    assert [s.service for s in collector.collect(0.0, 1.0)] == ["inference"]
    collector.close()
    collector.close()
    assert not collector.up and fake.initialised == 0
    assert fake.calls["nvmlGpmSampleFree"] == 2 and fake.calls["nvmlEventSetFree"] == 1
    assert collector.collect(1.0, 2.0) == []


def test_a_gpu_already_lost_at_start_is_left_out_and_the_rest_is_watched(caplog):
    lost, fine = FakeGpu("GPU-gone", lost=True), FakeGpu("GPU-fine", processes={100: GIB})
    with caplog.at_level(logging.ERROR, logger="slotune.nvml"):
        collector, _ = started(lost, fine)
    assert [str(d) for d in collector.devices] == ["GPU 1 (NVIDIA H200, GPU-fine)"]
    assert any("GPU 0 cannot be opened" in r.getMessage() for r in caplog.records)
    assert by_service(collector.collect(0.0, 1.0))["inference"].gauges[("gpu_memory_bytes", "")] == GIB
