"""LiteLLM's proxy, with `callbacks: [prometheus]`: /metrics on its port, families
`litellm_*`. Names from "Prometheus metrics" (https://docs.litellm.ai/docs/proxy/prometheus):
litellm_request_total_latency_metric (seconds, the whole request through the proxy),
litellm_llm_api_time_to_first_token_metric, and the per-deployment totals
litellm_deployment_total_requests / _failure_responses. A key's max_parallel_requests
and rpm_limit are set live with `POST /key/update` (rpm_limit is per minute; the
actuator converts slotune's per-second rate)."""
from slotune.profiles import Counter, Histogram, Profile, Setting

LIMITS = ("max_parallel_requests", "rpm_limit", "tpm_limit")   # the key limits a [control.targets] entry names


def target_error(target: str) -> str | None:
    return None if target in LIMITS else f"{target!r} is not a LiteLLM key limit; one of {', '.join(LIMITS)}"


PROFILE = Profile(
    name="litellm",
    doc="https://docs.litellm.ai/docs/proxy/prometheus",
    signals={
        "request_duration_seconds": Histogram(("litellm_request_total_latency_metric",)),
        "time_to_first_token_seconds": Histogram(("litellm_llm_api_time_to_first_token_metric",)),
        "requests_total": Counter("litellm_deployment_total_requests_total"),
        "errors_total": Counter("litellm_deployment_failure_responses_total"),
    },
    settings=(Setting("concurrency_limit", "litellm", "max_parallel_requests"),
              Setting("rate_limit_rps", "litellm", "rpm_limit")),
    slos=("p99", "ttft"),
    processes=("litellm",),
    control=('url = "http://127.0.0.1:4000"   # the proxy', 'key_file = "/etc/slotune/litellm.key"   # the key it tunes'),
    marks=(r"litellm_.*",),
)
