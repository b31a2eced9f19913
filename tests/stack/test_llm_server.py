"""The inference server in LLM mode, over real HTTP to its own process: tokens
stream one event at a time, continuous batching lets a short request overtake a
long one, max_num_seqs and scheduling_policy apply at run time, a full KV cache
preempts without losing requests, and OpenAI's own client speaks to it."""
from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from reference_stack import launcher

from .conftest import one_service

MODEL = "reference-decoder"
KV_CACHE_TOKENS = 600        # eight requests of 50 + 100 tokens need 1200: the cache must preempt


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("llm")
    files = launcher.init_run_dir(run_dir)
    port = launcher.free_ports(1)[0]
    url = f"http://127.0.0.1:{port}"
    args = ["inference", "--port", str(port), "--run-dir", str(run_dir), *launcher.SMALL_LLM_MODEL,
            "--kv-cache-tokens", str(KV_CACHE_TOKENS)]
    with one_service(args, url + "/healthz"):
        yield Server(url, files["token_file"].read_text().strip())


class Server:
    def __init__(self, url: str, token: str):
        self.url, self.token = url, token
        self.port = int(url.rsplit(":", 1)[1])

    def post(self, path: str, body, raw: bytes | None = None) -> tuple[int, dict]:
        req = urllib.request.Request(self.url + path, raw if raw is not None else json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def complete(self, prompt: str, max_tokens: int, **extra) -> dict:
        status, body = self.post("/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens,
                                                     **extra})
        assert status == 200, body
        return body

    def stream(self, prompt: str, max_tokens: int, on_first=None) -> tuple[list[tuple[float, dict]], float]:
        """The stream's events with the monotonic time each line arrived, and when the request was sent."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        sent = time.monotonic()
        conn.request("POST", "/v1/completions", json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens,
                                                            "stream": True}), {"Content-Type": "application/json"})
        response = conn.getresponse()
        assert response.status == 200 and response.getheader("Content-Type").startswith("text/event-stream")
        events = []
        while line := response.readline():
            if not line.startswith(b"data: "):
                continue
            now, data = time.monotonic(), line[6:].strip()
            events.append((now, "[DONE]" if data == b"[DONE]" else json.loads(data)))
            if len(events) == 1 and on_first:
                on_first()
        conn.close()
        return events, sent

    def admin(self, method: str, body=None) -> tuple[int, dict]:
        req = urllib.request.Request(self.url + "/admin/config", json.dumps(body).encode() if body else None,
                                     {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
                                     method=method)
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def patch(self, **changes) -> None:
        status, body = self.admin("PATCH", changes)
        assert status == 200, body

    def metrics(self) -> dict[tuple[str, str], float]:
        """(sample name, its label values joined by commas: the le of a bucket, "" when none) -> value."""
        text = urllib.request.urlopen(self.url + "/metrics", timeout=10).read().decode()
        return {(s.name, ",".join(s.labels.values())): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}


@pytest.fixture
def settings_restored(llm):
    before = llm.admin("GET")[1]["settings"]
    yield
    llm.patch(**before)


def test_a_streamed_completion_arrives_token_by_token(llm):
    events, sent = llm.stream("tell me a story", 60)
    assert events[-1][1] == "[DONE]"
    tokens = [e for _, e in events[:-1]]
    assert len(tokens) == 60 and all(len(e["choices"][0]["text"]) == 1 for e in tokens)
    assert [e["choices"][0]["finish_reason"] for e in tokens] == [None] * 59 + ["length"]
    first, last = events[0][0] - sent, events[-2][0] - sent
    assert first < 0.5 * last, (first, last)        # a prefill and 59 decode steps lie between them
    whole = llm.complete("tell me a story", 60)
    assert "".join(e["choices"][0]["text"] for e in tokens) == whole["choices"][0]["text"]
    assert whole["usage"] == {"prompt_tokens": 15, "completion_tokens": 60, "total_tokens": 75}


def test_a_short_request_arriving_during_a_long_one_finishes_first(llm):
    """With request-level batching the short one would wait for the long one's batch to end."""
    short_done = []

    def send_short():
        threading.Thread(target=lambda: (llm.complete("short", 3), short_done.append(time.monotonic()))).start()

    events, _ = llm.stream("a long answer, please", 250, on_first=send_short)
    deadline = time.monotonic() + 30
    while not short_done and time.monotonic() < deadline:
        time.sleep(0.01)
    long_done = events[-1][0]
    assert short_done and short_done[0] < long_done
    assert sum(t > short_done[0] for t, _ in events) >= 10      # the long one kept streaming after it


def _concurrent_load(llm, n: int, max_tokens: int) -> tuple[list[dict], dict[str, float]]:
    """n requests at once; the largest running and waiting gauges seen while they ran."""
    seen = {"running": 0.0, "waiting": 0.0}
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            m = llm.metrics()
            seen["running"] = max(seen["running"], m[("inference_num_requests_running", "")])
            seen["waiting"] = max(seen["waiting"], m[("inference_num_requests_waiting", "")])
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with ThreadPoolExecutor(n) as pool:
            answers = list(pool.map(lambda i: llm.complete(f"request number {i}", max_tokens), range(n)))
    finally:
        stop.set()
        watcher.join()
    return answers, seen


def _steps(llm) -> tuple[float, float]:
    """Model steps so far, and those that ran at most 2 sequences."""
    m = llm.metrics()
    return m[("inference_iteration_sequences_count", "")], m[("inference_iteration_sequences_bucket", "2.0")]


def test_max_num_seqs_changed_at_run_time_bounds_the_running_batch(llm, settings_restored):
    llm.patch(max_num_seqs=2)
    steps, narrow = _steps(llm)
    _, seen = _concurrent_load(llm, 6, 40)
    steps_after, narrow_after = _steps(llm)
    assert steps_after - steps == narrow_after - narrow > 0     # every step ran at most 2 sequences
    assert seen["running"] <= 2 and seen["waiting"] >= 1
    llm.patch(max_num_seqs=6)
    _concurrent_load(llm, 6, 40)
    steps_wide, narrow_wide = _steps(llm)
    assert (steps_wide - steps_after) - (narrow_wide - narrow_after) > 0     # some steps ran 3 or more


def test_a_full_kv_cache_preempts_and_every_request_completes(llm):
    before = llm.metrics()[("inference_num_preemptions_total", "")]
    answers, _ = _concurrent_load(llm, 8, 100)
    assert [a["usage"]["completion_tokens"] for a in answers] == [100] * 8
    assert all(len(a["choices"][0]["text"]) == 100 for a in answers)
    m = llm.metrics()
    assert m[("inference_num_preemptions_total", "")] > before
    assert m[("inference_kv_cache_usage_ratio", "")] == 0 and m[("inference_num_requests_running", "")] == 0


def test_a_client_that_leaves_mid_stream_frees_its_place(llm):
    before = llm.metrics()
    conn = http.client.HTTPConnection("127.0.0.1", llm.port, timeout=60)
    conn.request("POST", "/v1/completions", json.dumps({"model": MODEL, "prompt": "bye", "max_tokens": 250,
                                                        "stream": True}), {"Content-Type": "application/json"})
    response = conn.getresponse()
    while response.readline() != b"\n":          # the first event's blank line: it is decoding
        pass
    conn.sock.shutdown(2)
    conn.close()
    deadline = time.monotonic() + 20

    def aborted(m):
        return m.get(("inference_request_success_total", "abort"), 0)

    while aborted(llm.metrics()) == aborted(before):
        assert time.monotonic() < deadline, "the server kept decoding for a client that left"
        time.sleep(0.05)
    after = llm.metrics()
    assert after[("inference_num_requests_running", "")] == 0 and after[("inference_kv_cache_usage_ratio", "")] == 0
    assert after[("inference_generation_tokens_total", "")] - before[("inference_generation_tokens_total", "")] < 250


def test_priority_policy_serves_the_lower_priority_value_first(llm, settings_restored):
    llm.patch(max_num_seqs=1, scheduling_policy="priority")
    finished = {}

    def run(name, priority, max_tokens):
        llm.complete(name, max_tokens, priority=priority)
        finished[name] = time.monotonic()

    def until(sample: str, n: int) -> None:
        """Wait (polling the server's own gauge) until it reads n."""
        deadline = time.monotonic() + 10
        while llm.metrics()[(sample, "")] != n:
            assert time.monotonic() < deadline, f"{sample} never read {n}"

    threads = [threading.Thread(target=run, args=args) for args in
               [("blocker", 0, 256), ("low", 5, 5), ("high", 0, 5)]]
    threads[0].start()
    until("inference_num_requests_running", 1)
    for queued, t in enumerate(threads[1:], 1):   # "low" waits first; under fcfs it would also finish first
        t.start()
        until("inference_num_requests_waiting", queued)
    assert "blocker" not in finished, "the blocker ended before both others were waiting: nothing was tested"
    for t in threads:
        t.join(timeout=60)
    assert finished["blocker"] < finished["high"] < finished["low"]


def test_openai_python_client_streaming_and_not(llm):
    client = openai.OpenAI(base_url=llm.url + "/v1", api_key="unused", max_retries=0)
    done = client.completions.create(model=MODEL, prompt="Say something", max_tokens=7)
    assert len(done.choices[0].text) == 7 and done.choices[0].finish_reason == "length"
    assert (done.usage.prompt_tokens, done.usage.completion_tokens) == (13, 7)
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=5)
    assert chat.choices[0].message.role == "assistant" and len(chat.choices[0].message.content) == 5
    chunks = list(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                                 max_tokens=5, stream=True, stream_options={"include_usage": True}))
    deltas = [c.choices[0].delta.content for c in chunks if c.choices]
    assert "".join(deltas) == chat.choices[0].message.content and len(deltas) == 5
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[-1].usage.completion_tokens == 5
    streamed = client.completions.create(model=MODEL, prompt="Say something", max_tokens=7, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == done.choices[0].text
    with pytest.raises(openai.NotFoundError) as missing:
        client.completions.create(model="gpt-4o", prompt="x")
    assert missing.value.code == "model_not_found" and missing.value.param == "model"
    with pytest.raises(openai.BadRequestError) as too_long:
        client.completions.create(model=MODEL, prompt="x" * 300, max_tokens=100)
    assert too_long.value.code == "context_length_exceeded"


def test_errors_come_back_in_openai_shape(llm):
    for body, raw, param in [(None, b"{not json", None), ({"model": MODEL, "prompt": "x", "max_tokens": 0}, None,
                                                             "max_tokens"),
                             ({"model": MODEL}, None, "messages"), ({"prompt": "x"}, None, "model")]:
        path = "/v1/chat/completions" if body == {"model": MODEL} else "/v1/completions"
        status, answer = llm.post(path, body, raw)
        assert status == 400, answer
        assert set(answer) == {"error"} and set(answer["error"]) == {"message", "type", "param", "code"}
        assert answer["error"]["type"] == "invalid_request_error" and answer["error"]["param"] == param
        assert answer["error"]["message"]


def test_settings_are_checked_and_exported(llm):
    status, body = llm.admin("PATCH", {"scheduling_policy": "lifo"})
    assert status == 400 and "allowed: fcfs, priority" in body["error"]
    status, body = llm.admin("GET")
    assert body["bounds"]["scheduling_policy"] == ["fcfs", "priority"]
    assert body["settings"]["max_num_seqs"] == 256 and body["settings"]["max_num_batched_tokens"] == 2048
    m = llm.metrics()
    assert ("inference_time_to_first_token_seconds_bucket", "0.001") in m
    assert ("inference_request_duration_seconds_count", "") not in m          # the generate mode's metrics
    assert ("inference_gpu_memory_bytes", "") not in m                        # CUDA only
