"""The inference server's dynamic batcher, driven over real HTTP: concurrent
requests share batches, and max_batch_size changed at run time bounds them."""
from __future__ import annotations

import urllib.request


def generate(stack, i: int) -> dict:
    status, body = stack.http("POST", stack.urls["inference"] + "/generate", {"prompt": f"request {i}"})
    assert status == 200, body
    return body


def test_concurrent_requests_are_batched_and_max_batch_size_applies_at_run_time(stack):
    before = stack.settings("inference")
    batches_before = stack.metric("inference", "inference_batch_size_count")
    try:
        stack.patch("inference", max_batch_size=2, max_queue_delay_ms=500)
        small = [b["batch_size"] for b in stack.concurrently(lambda i: generate(stack, i), list(range(8)))]
        stack.patch("inference", max_batch_size=8)
        large = [b["batch_size"] for b in stack.concurrently(lambda i: generate(stack, i), list(range(8)))]
    finally:
        stack.patch("inference", **before)
    assert max(small) == 2, small
    assert max(large) > 2, large
    # 8 requests at size <= 2 take at least 4 batches, 8 at <= 8 at least 1; the histogram counted them.
    batches = stack.metric("inference", "inference_batch_size_count") - batches_before
    assert 5 <= batches <= 16
    assert stack.metric("inference", "inference_tokens_total") > 0
    assert stack.metric("inference", "inference_queue_wait_seconds_count") >= 16


def test_answers_carry_generated_text_and_token_counts(stack):
    body = generate(stack, 0)
    assert body["tokens"] == len(body["text"]) > 0 and body["device"] == "cpu"
    status, body = stack.http("POST", stack.urls["inference"] + "/generate", {"text": "no prompt"})
    assert status == 400 and "prompt" in body["error"]


def test_gpu_memory_gauge_only_on_cuda(stack):
    """This machine has no GPU: the CPU server must not export a GPU gauge stuck at 0."""
    text = urllib.request.urlopen(stack.urls["inference"] + "/metrics", timeout=10).read().decode()
    assert "inference_batch_compute_seconds_bucket" in text
    assert "inference_gpu_memory_bytes" not in text
