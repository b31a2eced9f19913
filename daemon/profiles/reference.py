"""The reference stack (reference_stack/): its gateway, inference server and tools
export their signals under slotune's own suffixes (`inference_queue_wait_seconds`,
`gateway_tool_calls_total`, ...), so this profile reads every family ending in one,
under its own name; its settings are whatever its `/admin/config` (or the http-json
and file surfaces) takes. The default profile. Names: docs/reference-stack.md."""
from slotune.profiles import Profile, Suffix

PROFILE = Profile(
    name="reference",
    doc="docs/reference-stack.md",
    signals={s: Suffix() for s in (
        "request_duration_seconds", "queue_wait_seconds", "batch_compute_seconds", "batch_size", "inflight_requests", "traces_total",
        "tool_calls_total", "breaker_open", "tool_duration_seconds", "stage_duration_seconds",
        "time_to_first_token_seconds", "inter_token_latency_seconds", "num_requests_running",
        "num_requests_waiting", "kv_cache_usage_ratio", "num_preemptions_total", "iteration_tokens",
        "iteration_sequences")},
    settings=None,
    slos=("p99", "ttft", "tpot"),
    processes=("reference_stack",),
    marks=(r"([a-z]+)_setting",),    # every reference service exports <service>_setting{setting}
)
