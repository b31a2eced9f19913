"""Exposition text of the engines that cannot run on this machine, written from each
project's documentation (the page is named on each): the metric names, types, units
and label sets the docs give, with values chosen so a test knows what each signal must
read. Each function gives the text after n scrapes, so two scrapes make one interval."""


def hist(name: str, labels: str, bounds: list[float], cumulative: list[float], total: float) -> str:
    sep = "," if labels else ""
    lines = [f"# TYPE {name} histogram"]
    for le, c in zip([*map(repr, bounds), '"+Inf"'], cumulative):
        le = le if le.startswith('"') else f'"{le}"'
        lines.append(f"{name}_bucket{{{labels}{sep}le={le}}} {c}")
    lines += [f"{name}_sum{{{labels}}} {total}", f"{name}_count{{{labels}}} {cumulative[-1]}"]
    return "\n".join(lines) + "\n"


def vllm(n: int) -> str:
    """https://docs.vllm.ai/en/latest/usage/metrics.html and docs/design/metrics.md (V1):
    per interval 10 requests end to end (9 under 0.5 s, 1 under 2.5 s), TTFT 9 under 0.1 s and
    1 under 1 s, 100 token gaps under 0.05 s, queue time 10 under 0.02 s; 3 running and
    4 waiting; KV 0.42 used; 9 finished "stop", 1 "abort", 1 "error"; 2 preemptions; 40 engine
    steps of at most 8 tokens (vllm:iteration_tokens_total, a histogram despite its name)."""
    m = 'model_name="meta-llama/Llama-3.1-8B-Instruct"'
    return (hist("vllm:e2e_request_latency_seconds", m, [0.3, 0.5, 0.8, 1.0, 2.5], [0, 9 * n, 9 * n, 9 * n, 10 * n, 10 * n], 5.0 * n)
            + hist("vllm:time_to_first_token_seconds", m, [0.04, 0.1, 0.5, 1.0], [0, 9 * n, 9 * n, 10 * n, 10 * n], 1.2 * n)
            + hist("vllm:inter_token_latency_seconds", m, [0.01, 0.05, 0.1], [0, 100 * n, 100 * n, 100 * n], 3.0 * n)
            + hist("vllm:request_queue_time_seconds", m, [0.02, 0.1], [10 * n, 10 * n, 10 * n], 0.05 * n)
            + f"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{{m}}} 3.0\n"
            + f"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{{{m}}} 4.0\n"
            + f"# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{{{m}}} 0.42\n"
            + "# TYPE vllm:request_success_total counter\n"
            + f'vllm:request_success_total{{finished_reason="stop",{m}}} {9 * n}\n'
            + f'vllm:request_success_total{{finished_reason="length",{m}}} 0\n'
            + f'vllm:request_success_total{{finished_reason="abort",{m}}} {n}\n'
            + f'vllm:request_success_total{{finished_reason="error",{m}}} {n}\n'
            + f"# TYPE vllm:num_preemptions_total counter\nvllm:num_preemptions_total{{{m}}} {2 * n}\n"
            + hist("vllm:iteration_tokens_total", m, [1.0, 8.0, 16.0], [10 * n, 40 * n, 40 * n, 40 * n], 200.0 * n)
            + "# TYPE vllm:generation_tokens_total counter\n"
            + f"vllm:generation_tokens_total{{{m}}} {110 * n}\n")


def sglang(n: int) -> str:
    """https://docs.sglang.ai/references/production_metrics.html: the page's example
    names the per-token histogram sglang:time_per_output_token_seconds (newer servers:
    sglang:inter_token_latency_seconds); 8 requests per interval, 5 running, 2 queued,
    token usage 0.28, 1 aborted."""
    m = 'model_name="meta-llama/Llama-3.1-8B-Instruct"'
    return (hist("sglang:e2e_request_latency_seconds", m, [0.5, 1.0, 2.0], [6 * n, 8 * n, 8 * n, 8 * n], 4.0 * n)
            + hist("sglang:time_to_first_token_seconds", m, [0.1, 0.25], [8 * n, 8 * n, 8 * n], 0.4 * n)
            + hist("sglang:time_per_output_token_seconds", m, [0.02, 0.04], [50 * n, 64 * n, 64 * n], 1.5 * n)
            + f"# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{{{m}}} 5.0\n"
            + f"# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs{{{m}}} 2.0\n"
            + f"# TYPE sglang:token_usage gauge\nsglang:token_usage{{{m}}} 0.28\n"
            + f"# TYPE sglang:num_aborted_requests_total counter\nsglang:num_aborted_requests_total{{{m}}} {n}\n"
            + f"# TYPE sglang:num_requests_total counter\nsglang:num_requests_total{{{m}}} {8 * n}\n")


def tgi(n: int) -> str:
    """https://huggingface.co/docs/text-generation-inference/reference/metrics: histograms
    in seconds with no unit in the name, counters with no _total (tgi_request_count,
    tgi_request_failure); 6 requests per interval, 1 failed, queue 3, batch 4."""
    return (hist("tgi_request_duration", "", [0.5, 1.0, 5.0], [2 * n, 5 * n, 6 * n, 6 * n], 6.0 * n)
            + hist("tgi_request_queue_duration", "", [0.01, 0.1], [4 * n, 6 * n, 6 * n], 0.2 * n)
            + hist("tgi_request_mean_time_per_token_duration", "", [0.02, 0.05], [6 * n, 6 * n, 6 * n], 0.09 * n)
            + "# TYPE tgi_queue_size gauge\ntgi_queue_size 3\n"
            + "# TYPE tgi_batch_current_size gauge\ntgi_batch_current_size 4\n"
            + f"# TYPE tgi_request_count counter\ntgi_request_count {6 * n}\n"
            + f'# TYPE tgi_request_failure counter\ntgi_request_failure{{err="validation"}} {n}\n')


def triton(n: int) -> str:
    """https://docs.nvidia.com/deeplearning/triton-inference-server/user-guide/docs/user_guide/metrics.html:
    per model and version, counters with no _total; durations cumulative in microseconds.
    Per interval: 40 requests, 40 inferences in 10 executions (batches of 4), 2 failures,
    queue 40 x 2500 us, compute 40 x 8000 us (each request charged its batch's 8 ms)."""
    m = 'model="resnet50",version="1"'
    return ("# TYPE nv_inference_request_success counter\n" f"nv_inference_request_success{{{m}}} {40 * n}\n"
            "# TYPE nv_inference_request_failure counter\n" f"nv_inference_request_failure{{{m}}} {2 * n}\n"
            "# TYPE nv_inference_count counter\n" f"nv_inference_count{{{m}}} {40 * n}\n"
            "# TYPE nv_inference_exec_count counter\n" f"nv_inference_exec_count{{{m}}} {10 * n}\n"
            "# TYPE nv_inference_request_duration_us counter\n" f"nv_inference_request_duration_us{{{m}}} {40 * 12000 * n}\n"
            "# TYPE nv_inference_queue_duration_us counter\n" f"nv_inference_queue_duration_us{{{m}}} {40 * 2500 * n}\n"
            "# TYPE nv_inference_compute_infer_duration_us counter\n"
            f"nv_inference_compute_infer_duration_us{{{m}}} {40 * 8000 * n}\n"
            "# TYPE nv_inference_pending_request_count gauge\n" f"nv_inference_pending_request_count{{{m}}} 6\n")


def envoy(n: int) -> str:
    """https://www.envoyproxy.io/docs/envoy/latest/configuration/upstream/cluster_manager/cluster_stats
    as /stats/prometheus writes it (envoy_ prefix, envoy_cluster_name label, request time
    in ms): 20 requests per interval, 18 under 25 ms and 2 under 250 ms; 3 answered 5xx, 17 2xx."""
    c = 'envoy_cluster_name="vllm"'
    return (hist("envoy_cluster_upstream_rq_time", c, [5, 25, 250, 1000], [0, 18 * n, 20 * n, 20 * n, 20 * n], 600 * n)
            + f"# TYPE envoy_cluster_upstream_rq_active gauge\nenvoy_cluster_upstream_rq_active{{{c}}} 7\n"
            + f"# TYPE envoy_cluster_upstream_rq_pending_active gauge\nenvoy_cluster_upstream_rq_pending_active{{{c}}} 2\n"
            + f"# TYPE envoy_cluster_upstream_rq_total counter\nenvoy_cluster_upstream_rq_total{{{c}}} {20 * n}\n"
            + "# TYPE envoy_cluster_upstream_rq_xx counter\n"
            + f'envoy_cluster_upstream_rq_xx{{envoy_response_code_class="2",{c}}} {17 * n}\n'
            + f'envoy_cluster_upstream_rq_xx{{envoy_response_code_class="5",{c}}} {3 * n}\n'
            + "# TYPE envoy_server_uptime gauge\nenvoy_server_uptime 100\n")


def litellm(n: int) -> str:
    """https://docs.litellm.ai/docs/proxy/prometheus: the proxy's total latency and the
    LLM API's TTFT (seconds), per-deployment totals; 12 requests per interval, 1 failed."""
    m = 'model="gpt-4o",api_key_alias="team-a"'
    return (hist("litellm_request_total_latency_metric", m, [0.5, 1.0, 5.0], [3 * n, 10 * n, 12 * n, 12 * n], 10.0 * n)
            + hist("litellm_llm_api_time_to_first_token_metric", m, [0.1, 0.5], [6 * n, 12 * n, 12 * n], 2.0 * n)
            + "# TYPE litellm_deployment_total_requests_total counter\n"
            + f'litellm_deployment_total_requests_total{{litellm_model_name="gpt-4o"}} {12 * n}\n'
            + "# TYPE litellm_deployment_failure_responses_total counter\n"
            + f'litellm_deployment_failure_responses_total{{litellm_model_name="gpt-4o"}} {n}\n')


def llamacpp(n: int) -> str:
    """llama-server --metrics, as the handler in ggml-org/llama.cpp examples/server/server.cpp
    at 61e588abcc3e418681e9528b46d61f5b23225fe2 writes it: HELP, TYPE and one sample per
    family, `llamacpp:` prefix, no labels, counters then gauges, each value a double put on a
    stringstream (6 significant digits). A stand-in: no llama.cpp runs in the test suite.
    Per interval 120 prompt and 300 generated tokens in 40 decodes; 3 requests processing,
    5 deferred, KV 0.375 used."""
    return ("# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.\n"
            "# TYPE llamacpp:prompt_tokens_total counter\n"
            f"llamacpp:prompt_tokens_total {120 * n}\n"
            "# HELP llamacpp:prompt_seconds_total Prompt process time\n"
            "# TYPE llamacpp:prompt_seconds_total counter\n"
            f"llamacpp:prompt_seconds_total {0.25 * n:g}\n"
            "# HELP llamacpp:tokens_predicted_total Number of generation tokens processed.\n"
            "# TYPE llamacpp:tokens_predicted_total counter\n"
            f"llamacpp:tokens_predicted_total {300 * n}\n"
            "# HELP llamacpp:tokens_predicted_seconds_total Predict process time\n"
            "# TYPE llamacpp:tokens_predicted_seconds_total counter\n"
            f"llamacpp:tokens_predicted_seconds_total {7.5 * n:g}\n"
            "# HELP llamacpp:n_decode_total Total number of llama_decode() calls\n"
            "# TYPE llamacpp:n_decode_total counter\n"
            f"llamacpp:n_decode_total {40 * n}\n"
            "# HELP llamacpp:n_busy_slots_per_decode Average number of busy slots per llama_decode() call\n"
            "# TYPE llamacpp:n_busy_slots_per_decode counter\n"
            "llamacpp:n_busy_slots_per_decode 2.75\n"
            "# HELP llamacpp:prompt_tokens_seconds Average prompt throughput in tokens/s.\n"
            "# TYPE llamacpp:prompt_tokens_seconds gauge\n"
            "llamacpp:prompt_tokens_seconds 480\n"
            "# HELP llamacpp:predicted_tokens_seconds Average generation throughput in tokens/s.\n"
            "# TYPE llamacpp:predicted_tokens_seconds gauge\n"
            "llamacpp:predicted_tokens_seconds 40\n"
            "# HELP llamacpp:kv_cache_usage_ratio KV-cache usage. 1 means 100 percent usage.\n"
            "# TYPE llamacpp:kv_cache_usage_ratio gauge\n"
            "llamacpp:kv_cache_usage_ratio 0.375\n"
            "# HELP llamacpp:kv_cache_tokens KV-cache tokens.\n"
            "# TYPE llamacpp:kv_cache_tokens gauge\n"
            "llamacpp:kv_cache_tokens 1536\n"
            "# HELP llamacpp:requests_processing Number of requests processing.\n"
            "# TYPE llamacpp:requests_processing gauge\n"
            "llamacpp:requests_processing 3\n"
            "# HELP llamacpp:requests_deferred Number of requests deferred.\n"
            "# TYPE llamacpp:requests_deferred gauge\n"
            "llamacpp:requests_deferred 5\n")
