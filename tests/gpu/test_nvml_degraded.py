"""Without an NVIDIA driver (these machines) the real pynvml fails to start:
the collector says so once, stays down, exports up 0, and the daemon runs on."""
import ctypes.util
import logging
import subprocess

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from slotune.collectors.gpu.metrics import GpuMetrics
from slotune.collectors.gpu.collector import NvmlCollector
from slotune.export.samples import SampleExporter
from slotune.model.service import ServiceSpec
from tests.conftest import run_slotune

pytestmark = pytest.mark.skipif(ctypes.util.find_library("nvidia-ml") is not None,
                                reason="this host has an NVIDIA driver; the degraded path needs none")


def test_no_driver_reports_once_stays_down_and_exports_up_0(caplog):
    collector = NvmlCollector(pids_of=lambda service: {1})
    with caplog.at_level(logging.INFO, logger="slotune.nvml"):
        collector.start([ServiceSpec("inference")])
        found = [collector.collect(float(s), s + 1.0) for s in range(3)]
        collector.update_services([ServiceSpec("inference"), ServiceSpec("gateway")])
        found.append(collector.collect(3.0, 4.0))
        collector.close()
    assert not collector.up
    assert found == [[], [], [], []]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1, lines
    assert "libnvidia-ml.so.1" in lines[0] and "fix:" in lines[0]
    exporter = SampleExporter()  # as the daemon exports every collector's up flag
    exporter.set_collector_up(collector.name, collector.up)
    registry = CollectorRegistry(auto_describe=True)
    registry.register(GpuMetrics(collector))
    registry.register(exporter)
    text = generate_latest(registry).decode()
    assert 'slotune_collector_up{collector="nvml"} 0.0' in text
    assert "slotune_gpu_" not in text
    checked = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_doctor_marks_nvml_with_a_fix_and_still_exits_0(root_only):
    result = run_slotune("doctor")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("✗ NVML"))
    assert "no NVIDIA driver or GPU" in lines[at] and "GPU signals stay off" in lines[at]
    assert "fix: on a GPU host install the NVIDIA driver" in lines[at + 1]
    assert "the daemon can run" in result.stdout
