"""The LLM mode's Prometheus metrics, named in vLLM's spirit under the stack's
`inference_` prefix: per-request token latencies (TTFT, inter-token, e2e, queue,
prefill, decode), the scheduler's state after each step, and token counts."""
from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from .scheduler import Sequence, Step

# Fine enough for the ms-level TTFT and inter-token gaps of a small model on a CPU, wide enough for a queue.
TOKEN_BUCKETS = (.0005, .001, .002, .003, .005, .0075, .01, .015, .02, .03, .05, .075, .1, .15, .2, .3, .5,
                 .75, 1, 1.5, 2, 3, 5, 10, 20, 40, 80)
REQUEST_BUCKETS = (.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 1.5, 2, 3, 5, 7.5, 10, 15, 20, 30, 60, 120)
TOKEN_COUNT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
SEQ_COUNT_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024)


class LlmMetrics:
    """Registered when the server starts in LLM mode (the generate mode exports its own)."""

    def __init__(self, cuda: bool):
        self.ttft = Histogram("inference_time_to_first_token_seconds",
                              "from a request's arrival to its first token", buckets=TOKEN_BUCKETS)
        self.itl = Histogram("inference_inter_token_latency_seconds",
                             "between successive tokens of one request", buckets=TOKEN_BUCKETS)
        self.e2e = Histogram("inference_e2e_request_latency_seconds",
                             "from a request's arrival to its last token", buckets=REQUEST_BUCKETS)
        self.queue = Histogram("inference_request_queue_time_seconds",
                               "from arrival to the request's first scheduled step", buckets=REQUEST_BUCKETS)
        self.prefill = Histogram("inference_request_prefill_time_seconds",
                                 "from the first scheduled step to the first token", buckets=REQUEST_BUCKETS)
        self.decode = Histogram("inference_request_decode_time_seconds",
                                "from the first token to the last", buckets=REQUEST_BUCKETS)
        self.running = Gauge("inference_num_requests_running", "sequences in the running batch")
        self.waiting = Gauge("inference_num_requests_waiting", "sequences waiting to be scheduled")
        self.kv_usage = Gauge("inference_kv_cache_usage_ratio", "share of the KV cache's token capacity in use")
        self.preemptions = Counter("inference_num_preemptions", "sequences preempted (recomputed later) "
                                   "because the KV cache was full")
        self.prompt_tokens = Counter("inference_prompt_tokens", "prompt tokens prefilled (once per request)")
        self.generation_tokens = Counter("inference_generation_tokens", "tokens generated")
        self.iteration_tokens = Histogram("inference_iteration_tokens", "tokens run per model step "
                                          "(prefill chunks + decodes)", buckets=TOKEN_COUNT_BUCKETS)
        self.iteration_seqs = Histogram("inference_iteration_sequences", "sequences run per model step",
                                        buckets=SEQ_COUNT_BUCKETS)
        self.gpu_memory = (Gauge("inference_gpu_memory_bytes", "CUDA memory the model server holds "
                                 "(torch.cuda.memory_reserved)") if cuda else None)
        self.success = Counter("inference_request_success", "finished requests by why they ended",
                               ["finished_reason"])

    def on_step(self, step: Step, running: int, waiting: int, kv_usage: float) -> None:
        if step.chunks:
            self.iteration_tokens.observe(step.tokens)
            self.iteration_seqs.observe(len(step.chunks))
        self.preemptions.inc(len(step.preempted))
        self.on_state(running, waiting, kv_usage)

    def on_state(self, running: int, waiting: int, kv_usage: float) -> None:
        self.running.set(running)
        self.waiting.set(waiting)
        self.kv_usage.set(kv_usage)

    def on_token(self, seq: Sequence) -> None:
        self.generation_tokens.inc()
        times = seq.token_times
        if len(times) == 1:
            self.ttft.observe(times[0] - seq.arrived)
            self.prompt_tokens.inc(len(seq.prompt))
        else:
            self.itl.observe(times[-1] - times[-2])

    def on_finish(self, seq: Sequence) -> None:
        self.success.labels(seq.finish_reason).inc()
        if seq.finish_reason != "length":
            return
        self.e2e.observe(seq.finished - seq.arrived)
        self.queue.observe(seq.first_scheduled - seq.arrived)
        self.prefill.observe(seq.token_times[0] - seq.first_scheduled)
        self.decode.observe(seq.finished - seq.token_times[0])
