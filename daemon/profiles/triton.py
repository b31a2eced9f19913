"""NVIDIA Triton Inference Server: /metrics on port 8002, families `nv_inference_*`
labelled model and version. From "Metrics"
(https://docs.nvidia.com/deeplearning/triton-inference-server/user-guide/docs/user_guide/metrics.html):
the durations are cumulative microsecond counters (nv_inference_request_duration_us,
_queue_duration_us, _compute_infer_duration_us), so they give means per interval, not
tails; the mean batch size is nv_inference_count / nv_inference_exec_count. A request's
compute time is its batch's, so Δcompute / Δrequests is the mean batch time. Batching
settings go in with `POST /v2/repository/models/<model>/load` and a config override
(https://docs.nvidia.com/deeplearning/triton-inference-server/user-guide/docs/protocol/extension_model_repository.html),
which swaps the model in without dropping requests."""
import re

from slotune.profiles import Counter, Gauge, Profile, Ratio, Setting

US = 1e-6

PATH = re.compile(r"[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)*")   # what a [control.targets] entry names


def target_error(target: str) -> str | None:
    return None if PATH.fullmatch(target) else \
        f"{target!r} is not a dotted field path of Triton's model config, e.g. dynamic_batching.max_queue_delay_microseconds"


PROFILE = Profile(
    name="triton",
    doc="https://docs.nvidia.com/deeplearning/triton-inference-server/user-guide/docs/user_guide/metrics.html",
    signals={
        "request_duration_mean_seconds": Ratio("nv_inference_request_duration_us", "nv_inference_request_success", US),
        "queue_wait_mean_seconds": Ratio("nv_inference_queue_duration_us", "nv_inference_request_success", US),
        "batch_size": Ratio("nv_inference_count", "nv_inference_exec_count"),
        "batch_compute_seconds": Ratio("nv_inference_compute_infer_duration_us", "nv_inference_request_success", US,
                                       count="nv_inference_exec_count"),
        "num_requests_waiting": Gauge(("nv_inference_pending_request_count",)),
        "requests_total": Counter("nv_inference_request_success"),
        "errors_total": Counter("nv_inference_request_failure"),
    },
    settings=(
        Setting("max_batch_size", "triton", "max_batch_size"),
        Setting("max_queue_delay_ms", "triton", "dynamic_batching.max_queue_delay_microseconds"),
    ),
    processes=("tritonserver",),
    control=('url = "http://127.0.0.1:8000"   # its HTTP endpoint', 'model = "MODEL"   # the model to reload'),
    marks=(r"nv_inference_.*",),
)
