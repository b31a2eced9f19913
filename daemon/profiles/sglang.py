"""SGLang's server (launched with --enable-metrics): /metrics on its API port,
families prefixed `sglang:`, labelled model_name. Names from "Production Metrics"
(https://docs.sglang.ai/references/production_metrics.html) and its collector
(python/sglang/srt/metrics/collector.py): queue depth is sglang:num_queue_reqs, KV use
sglang:token_usage (0..1), TPOT sglang:inter_token_latency_seconds (older servers:
sglang:time_per_output_token_seconds). Its running-request cap is set live through
`POST /set_internal_state` where the server version has it."""
import re

from slotune.profiles import Counter, Gauge, Histogram, Profile, Setting

KEY = re.compile(r"[a-z_][a-z0-9_]*")   # what a [control.targets] entry names: a server argument


def target_error(target: str) -> str | None:
    return None if KEY.fullmatch(target) else f"{target!r} is not an SGLang server argument name (e.g. max_running_requests)"


PROFILE = Profile(
    name="sglang",
    doc="https://docs.sglang.ai/references/production_metrics.html",
    signals={
        "request_duration_seconds": Histogram(("sglang:e2e_request_latency_seconds",)),
        "time_to_first_token_seconds": Histogram(("sglang:time_to_first_token_seconds",)),
        "inter_token_latency_seconds": Histogram(("sglang:inter_token_latency_seconds",
                                                  "sglang:time_per_output_token_seconds")),
        "queue_wait_seconds": Histogram(("sglang:queue_time_seconds",)),
        "num_requests_running": Gauge(("sglang:num_running_reqs",)),
        "num_requests_waiting": Gauge(("sglang:num_queue_reqs",)),
        "inflight_requests": Gauge(("sglang:num_running_reqs", "sglang:num_queue_reqs")),
        "kv_cache_usage_ratio": Gauge(("sglang:token_usage",)),
        "requests_total": Counter("sglang:num_requests_total"),
        "errors_total": Counter("sglang:num_aborted_requests_total"),
    },
    settings=(Setting("max_running_requests", "sglang", "max_running_requests"),),
    slos=("p99", "ttft", "tpot"),
    processes=("sglang",),
    control=('url = "http://127.0.0.1:30000"   # its server',),
    marks=(r"sglang:.*",),
    routes=("/generate", "/v1/completions", "/v1/chat/completions"),
)
