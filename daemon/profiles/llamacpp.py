"""llama.cpp's own server, `llama-server`: /metrics on its API port only when started
with `--metrics`, families prefixed `llamacpp:`, no labels. Names and types from the
handler that writes the page, ggml-org/llama.cpp examples/server/server.cpp at
61e588abcc3e418681e9528b46d61f5b23225fe2 (now tools/server/; the list is in
tools/server/README.md, "GET /metrics",
https://github.com/ggml-org/llama.cpp/blob/master/tools/server/README.md): counters
prompt_tokens_total, prompt_seconds_total, tokens_predicted_total,
tokens_predicted_seconds_total, n_decode_total (each with _total in its name), and
n_busy_slots_per_decode (typed counter, a mean); gauges prompt_tokens_seconds,
predicted_tokens_seconds, kv_cache_usage_ratio (0..1), kv_cache_tokens,
requests_processing (busy slots), requests_deferred (tasks waiting for a slot). Newer
servers render the page from server_task_result_metrics::to_metrics
(tools/server/server-task.cpp) with the same names less the two kv_cache gauges, so
KV use is read where the server still has it. llama.cpp keeps no latency histogram
and no request or error count: latency, TTFT (first byte of a stream) and TPOT (the
gaps between its writes) come from the kernel `http` family, as do 5xx.

Its slots (`-np, --parallel N`) are how many requests it answers at once, the rest
deferred; a launch flag, so slotune recommends it. llama-cpp-python's server
(`python -m llama_cpp.server`, abetlen/llama-cpp-python llama_cpp/server/app.py at
013daea858d40e0feff6202677e0c4ecd80a91e3) has no metrics page at all: it is known by
its process and seen through eBPF only."""
from slotune.profiles import Gauge, Profile, Setting

PROFILE = Profile(
    name="llamacpp",
    doc="https://github.com/ggml-org/llama.cpp/blob/master/tools/server/README.md",
    signals={
        "num_requests_running": Gauge(("llamacpp:requests_processing",)),
        "num_requests_waiting": Gauge(("llamacpp:requests_deferred",)),
        "inflight_requests": Gauge(("llamacpp:requests_processing", "llamacpp:requests_deferred")),
        "kv_cache_usage_ratio": Gauge(("llamacpp:kv_cache_usage_ratio",)),
    },
    settings=(
        Setting("concurrency_limit", "", "--parallel", live=False),
    ),
    slos=("p99", "ttft", "tpot"),
    processes=("llama-server", "llama_cpp"),
    marks=(r"llamacpp:.*",),
    routes=("/completion", "/v1/completions", "/v1/chat/completions", "/chat/completions"),   # /completion: also /completions
)
