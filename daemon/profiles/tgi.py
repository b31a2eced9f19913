"""Hugging Face Text Generation Inference: /metrics on its router's port, families
prefixed `tgi_`, histograms in seconds though their names do not say so. Names from
https://huggingface.co/docs/text-generation-inference/reference/metrics: the queue is
tgi_queue_size, the batch tgi_batch_current_size; its per-token time is each request's
mean (tgi_request_mean_time_per_token_duration), not every gap. Read-only: its limits
are launcher flags slotune does not own."""
from slotune.profiles import Counter, Gauge, Histogram, Profile

PROFILE = Profile(
    name="tgi",
    doc="https://huggingface.co/docs/text-generation-inference/reference/metrics",
    signals={
        "request_duration_seconds": Histogram(("tgi_request_duration",)),
        "queue_wait_seconds": Histogram(("tgi_request_queue_duration",)),
        "inter_token_latency_seconds": Histogram(("tgi_request_mean_time_per_token_duration",)),
        "num_requests_running": Gauge(("tgi_batch_current_size",)),
        "num_requests_waiting": Gauge(("tgi_queue_size",)),
        "inflight_requests": Gauge(("tgi_batch_current_size", "tgi_queue_size")),
        "requests_total": Counter("tgi_request_count"),
        "errors_total": Counter("tgi_request_failure"),
    },
    settings=(),
    slos=("p99", "tpot"),
    processes=("text-generation-launcher", "text-generation-router"),
    marks=(r"tgi_.*",),
    routes=("/generate", "/v1/chat/completions"),           # /generate: also /generate_stream
)
