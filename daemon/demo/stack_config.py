"""A daemon config for a running reference stack (from its state.json): what
`slotune demo`, the benches and the end-to-end tests run the daemon with; for
a stack whose inference server runs in LLM mode, its token SLOs, the metrics
that time them and the continuous_batch tuner."""
from __future__ import annotations

from pathlib import Path

# The stack's settings the daemon starts from: the gateway's own default concurrency
# limit is 0, no limit, which the throttle refuses to steer (tuners/throttle.py).
DEMO_STACK_SETTINGS = {"gateway": {"concurrency_limit": 32}}
DEMO_GATEWAY_TUNERS = """[services.gateway.tuners.throttle]
interval_s = 2.0
[services.gateway.tuners.degrade]
interval_s = 1.0
[services.gateway.tuners.sampling]
interval_s = 5.0
budget_traces_per_s = 2.0
[services.gateway.tuners.drift]
interval_s = 30.0
"""
DEMO_INFERENCE_TUNERS = """[services.inference.tuners.batch]
interval_s = 5.0
"""
LLM_INFERENCE_TUNERS = """[services.inference.tuners.continuous_batch]
interval_s = 5.0
"""
# the inference server's settings and what the daemon may do with them, per mode
GENERATE_SETTINGS = """[services.inference.settings.max_batch_size]
min = 1
max = 64
max_step = 8
integer = true
[services.inference.settings.max_queue_delay_ms]
min = 0
max = 50
max_step = 10
"""
LLM_SETTINGS = """[services.inference.settings.max_num_seqs]
min = 1
max = 256
max_step = 32
integer = true
[services.inference.settings.max_num_batched_tokens]
min = 64
max = 8192
max_step = 1024
integer = true
"""


def for_reference_stack(state: dict, exporter_port: int, work: Path, *, gateway_slo_ms: float = 1500.0,
                        inference_slo_ms: float = 1000.0, gateway_tuners: str = DEMO_GATEWAY_TUNERS,
                        inference_tuners: str = DEMO_INFERENCE_TUNERS, gateway_control_url: str = "",
                        environment: str = "demo", token_slos_ms: tuple[float, float] | None = None) -> str:
    """token_slos_ms: (TTFT, TPOT) P99 objectives of an inference server in LLM mode."""
    ports, token = state["ports"], state["token_file"]
    if token_slos_ms:
        timing = (f'latency_metric = "inference_e2e_request_latency_seconds"\n'
                  f"slo_ttft_p99_ms = {token_slos_ms[0]}\nslo_tpot_p99_ms = {token_slos_ms[1]}\n"
                  'ttft_metric = "inference_time_to_first_token_seconds"\n'
                  'tpot_metric = "inference_inter_token_latency_seconds"')
        settings = LLM_SETTINGS
    else:
        timing, settings = 'latency_metric = "inference_request_duration_seconds"', GENERATE_SETTINGS
    gateway_control_url = gateway_control_url or f"http://127.0.0.1:{ports['gateway']}/admin/config"
    return f"""# a slotune config for the reference stack in {state['run_dir']}
[daemon]
collect_interval_s = 1.0
tune_interval_s = 5.0
exporter_address = "127.0.0.1:{exporter_port}"
baseline_store = "{work}/baselines.sqlite"
audit_log = "{work}/audit.jsonl"
environment = "{environment}"

[services.gateway]
cmdline = "reference_stack gateway"
port = {ports['gateway']}
slo_p99_ms = {gateway_slo_ms}
metrics_url = "http://127.0.0.1:{ports['gateway']}/metrics"
latency_metric = "gateway_request_duration_seconds"
downstream = ["inference"]
peers = {{ "{ports['inference']}" = "inference", "{ports['sidecar']}" = "sidecar" }}

[services.gateway.control]
kind = "reference"
url = "{gateway_control_url}"
token_file = "{token}"

{gateway_tuners}
[services.gateway.settings.concurrency_limit]
min = 2
max = 256
max_step = 16
integer = true
[services.gateway.settings.degrade_ratio]
min = 0.0
max = 1.0
max_step = 1.0
[services.gateway.settings.rate_limit_rps]
min = 1
max = 1000
max_step = 100
[services.gateway.settings.trace_sample_rate]
min = 0.001
max = 1.0
max_step = 0.2
[services.gateway.settings.trace_keep_slower_than_s]
min = 0.0
max = 60.0
max_step = 5.0

[services.inference]
cmdline = "reference_stack inference"
port = {ports['inference']}
slo_p99_ms = {inference_slo_ms}
metrics_url = "http://127.0.0.1:{ports['inference']}/metrics"
{timing}

[services.inference.control]
kind = "reference"
url = "http://127.0.0.1:{ports['inference']}/admin/config"
token_file = "{token}"

{inference_tuners}
{settings}"""
