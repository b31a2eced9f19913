"""The parts of bench/gpu_check.sh that run without a GPU: argument handling,
the clear "no GPU" exit, and the Python helpers it drives (PIDs of a service,
the load clients, stopping process groups, the attribution and capacity steps)."""
import ctypes.util
import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bench import gpu_check
from tests.conftest import ROOT

SCRIPT = ROOT / "bench" / "gpu_check.sh"
no_driver = pytest.mark.skipif(ctypes.util.find_library("nvidia-ml") is not None,
                               reason="this host has an NVIDIA driver")


def script(*args) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def test_help_lists_every_option_and_exits_0():
    result = script("--help")
    assert result.returncode == 0
    for option in ("--seconds", "--clients", "--server-cmd", "--skip-setup"):
        assert option in result.stdout


@pytest.mark.parametrize("args, message", [(["--bogus"], "unknown argument '--bogus'"),
                                           (["--seconds"], "--seconds needs a value")])
def test_bad_arguments_are_named_and_exit_2(args, message):
    result = script(*args)
    assert result.returncode == 2 and message in result.stderr


@no_driver
def test_without_a_gpu_the_script_and_its_helper_exit_3_and_start_nothing():
    result = script()
    assert result.returncode == 3
    assert "no NVIDIA GPU on this host" in result.stderr and "nothing was started" in result.stderr
    helper = subprocess.run([sys.executable, "-m", "bench.gpu_check", "run"], cwd=ROOT, capture_output=True,
                            text=True, timeout=60)
    assert helper.returncode == 3 and "fix: on a GPU host install the NVIDIA driver" in helper.stderr


def test_service_pids_are_the_started_process_and_its_children():
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                               "c = subprocess.Popen(['sleep', '30']); print(c.pid, flush=True); time.sleep(30)"],
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        child = int(parent.stdout.readline())
        assert gpu_check.service_pids(parent.pid) == {parent.pid, child}
    finally:
        gpu_check.stop(parent)
    assert parent.returncode is not None
    assert gpu_check.service_pids(parent.pid) == set()


def test_a_server_that_dies_at_start_is_reported_not_waited_for():
    dead = subprocess.Popen([sys.executable, "-c", "raise SystemExit(4)"], start_new_session=True)
    with pytest.raises(RuntimeError, match="exited with status 4"):
        gpu_check.wait_healthy(f"http://127.0.0.1:{gpu_check.free_port()}/healthz", dead, 30)


class Generate(BaseHTTPRequestHandler):
    """A loopback endpoint that answers POST /generate like the inference server's shape."""
    bodies: list = []

    def do_POST(self):
        Generate.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        status = 200 if self.path == "/generate" else 404
        self.send_response(status)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):
        pass


@pytest.fixture
def generate_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Generate)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_load_clients_post_json_concurrently_and_count_errors(generate_server):
    with gpu_check.Load(f"{generate_server}/generate", clients=4) as load:
        time.sleep(0.5)
    assert load.ok > 4 and load.errors == 0
    assert Generate.bodies[0]["max_new_tokens"] == 32 and "prompt" in Generate.bodies[0]
    assert load.summary().startswith(f"{load.ok} answers, 0 errors")
    with gpu_check.Load(f"{generate_server}/missing", clients=2) as failing:
        time.sleep(0.2)
    assert failing.ok == 0 and failing.errors > 0


def test_the_default_server_command_starts_the_reference_inference_server(tmp_path):
    """The same command line the GPU check uses, with the CPU in place of CUDA."""
    port = gpu_check.free_port()
    server = subprocess.Popen(gpu_check.server_command(gpu_check.DEFAULT_SERVER, port, str(tmp_path), "cpu"),
                              cwd=ROOT, start_new_session=True)
    try:
        gpu_check.wait_healthy(f"http://127.0.0.1:{port}/healthz", server, 90)
        assert server.pid in gpu_check.service_pids(server.pid)
        with gpu_check.Load(f"http://127.0.0.1:{port}/generate", clients=2) as load:
            deadline = time.monotonic() + 60
            while load.ok < 2 and load.errors == 0 and time.monotonic() < deadline:
                time.sleep(0.1)
        assert load.ok >= 2 and load.errors == 0
    finally:
        gpu_check.stop(server)


def test_verdict_needs_memory_and_utilisation_of_the_service():
    assert gpu_check.verdict({"gpu_memory_bytes": 2**30, "gpu_utilization_ratio": 0.4})[0]
    ok, line = gpu_check.verdict({"gpu_memory_bytes": 2**30, "gpu_utilization_ratio": 0.0})
    assert not ok and line.startswith("FAIL")
    shown = gpu_check.format_signals("t", {"gpu_memory_bytes": 3 * 2**20, "gpu_throttled": 1.0})
    assert "3 MiB" in shown and "gpu_pcie_ratio           absent" in shown


def test_attribution_step_says_plainly_when_the_command_is_missing():
    said = gpu_check.attribution("inference", timeout_s=60)
    if gpu_check.attribution_command_available():
        assert said.startswith("$ slotune attribute inference")
    else:
        assert "slotune attribute is not in this checkout yet" in said
