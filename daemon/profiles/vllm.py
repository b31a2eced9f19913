"""vLLM's OpenAI-compatible server: /metrics on its API port, families prefixed
`vllm:`, labelled model_name (and engine). Names from "Production Metrics"
(https://docs.vllm.ai/en/latest/usage/metrics.html) and the V1 metrics design
(https://docs.vllm.ai/en/latest/design/metrics.html): the TPOT histogram is
vllm:inter_token_latency_seconds (vllm:time_per_output_token_seconds before V1); KV
use is vllm:kv_cache_usage_perc, a 0..1 fraction despite its name; a request that
finished aborted or in error (request_success_total{finished_reason="abort"|"error"})
counts as an error; vllm:iteration_tokens_total is a histogram (tokens per engine
step) despite its name, and vllm:num_preemptions_total counts preemptions. Its scheduler
limits are launch flags (vllm serve --max-num-seqs, --max-num-batched-tokens), so
slotune recommends them; admission is throttled at a proxy in front (admission_by)."""
from slotune.profiles import Counter, Gauge, Histogram, Profile, Setting

PROFILE = Profile(
    name="vllm",
    doc="https://docs.vllm.ai/en/latest/usage/metrics.html",
    signals={
        "request_duration_seconds": Histogram(("vllm:e2e_request_latency_seconds",)),
        "time_to_first_token_seconds": Histogram(("vllm:time_to_first_token_seconds",)),
        "inter_token_latency_seconds": Histogram(("vllm:inter_token_latency_seconds",
                                                  "vllm:time_per_output_token_seconds")),
        "queue_wait_seconds": Histogram(("vllm:request_queue_time_seconds",)),
        "num_requests_running": Gauge(("vllm:num_requests_running",)),
        "num_requests_waiting": Gauge(("vllm:num_requests_waiting",)),
        "inflight_requests": Gauge(("vllm:num_requests_running", "vllm:num_requests_waiting")),
        "kv_cache_usage_ratio": Gauge(("vllm:kv_cache_usage_perc",)),
        "requests_total": Counter("vllm:request_success_total"),
        "errors_total": Counter("vllm:request_success_total", (("finished_reason", ("abort", "error")),)),
        "num_preemptions_total": Counter("vllm:num_preemptions_total"),
        "iteration_tokens": Histogram(("vllm:iteration_tokens_total",)),
    },
    settings=(
        Setting("max_num_seqs", "", "--max-num-seqs", live=False),
        Setting("max_num_batched_tokens", "", "--max-num-batched-tokens", live=False),
    ),
    slos=("p99", "ttft", "tpot"),
    processes=("vllm",),
    marks=(r"vllm:.*",),
    routes=("/v1/chat/completions", "/v1/completions"),    # its OpenAI-compatible API's generating paths
)
