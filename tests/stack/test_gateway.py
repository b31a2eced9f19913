"""The agent gateway over real HTTP, real Redis and real tool processes: the
intent gate, the three cache levels, parallel tools, the breaker, the rate
limit and the LLM call through the TLS sidecar; and, beside an inference server
in LLM mode, the streamed answer, its first-token timing and the dimmer there."""
from __future__ import annotations

import hashlib
import json
import time
import urllib.request

import pytest
import redis

from reference_stack import launcher
from reference_stack.client import StackClient
from reference_stack.corpus import rewordings
from reference_stack.tools import TOOLS
from tests.stack.conftest import one_service


def test_chitchat_skips_the_tools_and_the_caches(stack):
    status, body = stack.query("tell me a joke")
    assert status == 200, body
    assert body["tools"] == [] and body["cache"] is None and body["answer"]


def test_intent_threshold_decides_who_gets_tools(stack):
    stack.patch("gateway", intent_threshold=1.0)
    try:
        strict = stack.query("what is the weather in Santiago")[1]
        stack.patch("gateway", intent_threshold=0.0)
        lax = stack.query("have a good day")[1]
    finally:
        stack.patch("gateway", intent_threshold=0.82)
    assert strict["tools"] == [] and strict["cache"] is None
    assert lax["cache"] == "miss" and [c["tool"] for c in lax["tools"]] == ["search"]   # no plan: a search


def test_cache_levels_lru_then_redis_then_vector(stack):
    query = "compare the weather in Vienna and Dublin"
    status, first = stack.query(query)
    assert status == 200 and first["cache"] == "miss" and not first["degraded"], first
    assert {c["tool"] for c in first["tools"]} == {"weather", "calculator"}

    assert stack.query(query)[1]["cache"] == "lru"

    key = "slotune:tools:" + hashlib.sha256(query.encode()).hexdigest()
    r = redis.Redis(port=stack.state["redis_port"])
    assert r.exists(key) and 0 < r.ttl(key) <= 300

    status, body = stack.admin("gateway", "POST", {"level": "lru"}, path="/admin/cache/flush")
    assert status == 200, body
    assert stack.query(query)[1]["cache"] == "redis"
    assert stack.query(query)[1]["cache"] == "lru"     # a Redis hit refills the LRU

    paraphrase = rewordings(query)[0]                   # "Compare the weather in Vienna and Dublin?"
    assert paraphrase != query
    status, body = stack.query(paraphrase)
    assert status == 200 and body["cache"] == "vector" and body["tools"] == [], body
    assert stack.query(paraphrase)[1]["cache"] == "lru"

    other_city = stack.query("compare the weather in Vienna and Prague")[1]
    assert other_city["cache"] == "miss"                # not close enough to reuse Dublin's answer


def test_independent_tools_run_in_parallel_and_dependents_after(stack):
    before = {name: stack.settings(name) for name in ("weather", "search")}
    stack.patch("weather", latency_ms=300, latency_sigma=0)
    stack.patch("search", latency_ms=300, latency_sigma=0)
    try:
        status, body = stack.query("plan a trip to Oslo, Lima and Cairo: weather and top sights")
    finally:
        for name, settings in before.items():
            stack.patch(name, **settings)
    assert status == 200 and body["cache"] == "miss", body
    calls = {c["id"]: c for c in body["tools"]}
    lookups = [c for c in calls.values() if c["tool"] in ("weather", "search")]
    assert len(lookups) == 6 and all(c["outcome"] == "ok" for c in lookups)
    # All six were in flight at once: each started before any of them ended.
    assert max(c["started_s"] for c in lookups) < min(c["ended_s"] for c in lookups)
    calc = calls["calculator"]
    weather = [c for c in lookups if c["tool"] == "weather"]
    assert calc["started_s"] >= max(c["ended_s"] for c in weather)
    assert calc["args"]["values"] == [c["result"]["temp_c"] for c in weather]


def test_failing_tool_opens_its_breaker_and_answers_degraded(stack):
    stack.patch("weather", failure_rate=1.0)
    rejected_before = stack.metric("gateway", "gateway_tool_calls_total", tool="weather", outcome="rejected")
    try:
        outcomes = []
        for day in range(40):                           # the window may still hold earlier successes
            status, body = stack.query(f"what is the weather in Paris on day {day}")
            assert status == 200 and body["degraded"], body
            outcomes += [c["outcome"] for c in body["tools"] if c["tool"] == "weather"]
            if outcomes[-1] == "rejected":
                break
        assert outcomes[-1] == "rejected", outcomes
        assert set(outcomes[:-1]) == {"error"} and len(outcomes) > 5   # opened after the 5-call minimum
        assert stack.metric("gateway", "gateway_breaker_open", tool="weather") == 1
        assert stack.metric("gateway", "gateway_tool_calls_total", tool="weather",
                            outcome="rejected") > rejected_before
        assert stack.query("what is the weather in Paris")[1]["cache"] == "miss"   # degraded answers not cached
    finally:
        stack.patch("weather", failure_rate=0.0)
    deadline = time.monotonic() + 30                    # half-open probe after the 1 s cooldown closes it
    while stack.metric("gateway", "gateway_breaker_open", tool="weather") == 1 and time.monotonic() < deadline:
        stack.query(f"what is the weather in Oslo {time.monotonic()}")
        time.sleep(0.3)
    assert stack.metric("gateway", "gateway_breaker_open", tool="weather") == 0


def test_rate_limit_refuses_with_429(stack):
    limited_before = stack.metric("gateway", "gateway_rate_limited_total")
    stack.patch("gateway", rate_limit_rps=1)
    try:
        results = stack.concurrently(stack.query, ["hello"] * 8)
    finally:
        stack.patch("gateway", rate_limit_rps=0)
    codes = sorted(status for status, _ in results)
    assert 200 in codes and 429 in codes, codes
    assert stack.metric("gateway", "gateway_rate_limited_total") - limited_before == codes.count(429)
    assert all("rate limited" in body["error"] for status, body in results if status == 429)


def test_slow_requests_keep_their_trace_even_when_not_sampled(stack):
    stack.patch("gateway", trace_sample_rate=0.0, trace_keep_slower_than_s=1e-6)
    try:
        slow = stack.query("good evening")[1]
        stack.patch("gateway", trace_keep_slower_than_s=600)
        fast = stack.query("good evening")[1]
    finally:
        stack.patch("gateway", trace_sample_rate=0.1, trace_keep_slower_than_s=0)
    assert "trace_id" in slow and "trace_id" not in fast
    assert slow["trace_id"] in next(stack.run_dir.glob("gateway-*-traces.jsonl")).read_text()


def test_concurrency_limit_refuses_with_429(stack):
    limited_before = stack.metric("gateway", "gateway_concurrency_limited_total")
    stack.patch("search", latency_ms=300, latency_sigma=0)
    stack.patch("gateway", concurrency_limit=1)
    try:
        results = stack.concurrently(stack.query, [f"search for chess openings {i}" for i in range(6)])
    finally:
        stack.patch("gateway", concurrency_limit=0)
        stack.patch("search", latency_ms=40, latency_sigma=0.3)
    codes = sorted(status for status, _ in results)
    assert 200 in codes and 429 in codes, codes
    assert stack.metric("gateway", "gateway_concurrency_limited_total") - limited_before == codes.count(429)
    assert all("concurrency limit: 1" in body["error"] for status, body in results if status == 429)


def test_trace_sampling_follows_its_setting(stack):
    stack.patch("gateway", trace_sample_rate=1.0)
    try:
        sampled = [stack.query("good morning")[1] for _ in range(3)]
        stack.patch("gateway", trace_sample_rate=0.0)
        unsampled = [stack.query("good morning")[1] for _ in range(3)]
    finally:
        stack.patch("gateway", trace_sample_rate=0.1)
    assert all("trace_id" in b for b in sampled) and not any("trace_id" in b for b in unsampled)
    traces = next(stack.run_dir.glob("gateway-*-traces.jsonl")).read_text()
    assert all(b["trace_id"] in traces for b in sampled)


def test_llm_via_sidecar_handshakes_per_request_only_without_reuse(stack):
    stack.patch("gateway", llm_via_sidecar=True)
    try:
        def handshakes_for(n):
            before = stack.metric("sidecar", "sidecar_handshakes_total")
            for _ in range(n):
                status, body = stack.query("how are you")
                assert status == 200, body
            return stack.metric("sidecar", "sidecar_handshakes_total") - before

        stack.patch("sidecar", reuse_connections=True)
        stack.query("how are you")                       # opens the kept-alive connection
        reused = handshakes_for(5)
        stack.patch("sidecar", reuse_connections=False)
        fresh = handshakes_for(5)
    finally:
        stack.patch("sidecar", reuse_connections=True)
        stack.patch("gateway", llm_via_sidecar=False)
    assert reused == 0
    assert fresh >= 4                                    # the first may still ride the old connection
    assert stack.metric("sidecar", "sidecar_request_duration_seconds_count") >= 11


def test_blocking_io_fault_writes_and_syncs_on_the_request_path(stack):
    scratch = list(stack.run_dir.glob("gateway-*.blocking"))
    assert scratch == []
    stack.patch("gateway", blocking_io_ms=20)
    try:
        assert stack.query("hello")[0] == 200
    finally:
        stack.patch("gateway", blocking_io_ms=0)
    (scratch,) = stack.run_dir.glob("gateway-*.blocking")
    assert scratch.stat().st_size == 4096


def test_bad_query_is_refused_with_the_shape_expected(stack):
    status, body = stack.http("POST", stack.state["query_url"], {"q": "hello"})
    assert status == 400 and '{"query"' in body["error"]


def test_a_dead_llm_is_a_502_error_not_a_hang(stack, tmp_path):
    """A second gateway, beside the stack's, whose inference server is not there."""
    gateway_port, dead_port = launcher.free_ports(2)
    tools = [f for name, url in stack.urls.items() if name in TOOLS for f in ("--tool", f"{name}={url}")]
    url = f"http://127.0.0.1:{gateway_port}"
    with one_service(["gateway", "--port", str(gateway_port), "--run-dir", str(tmp_path),
                      "--token-file", stack.state["token_file"], "--inference-url", f"http://127.0.0.1:{dead_port}",
                      "--redis-url", f"redis://127.0.0.1:{stack.state['redis_port']}/0", *tools], url + "/healthz"):
        status, body = stack.http("POST", url + "/query", {"query": "hello"})
        assert status == 502 and "LLM call failed" in body["error"], body
        metrics = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
        assert 'gateway_request_duration_seconds_count{outcome="error"} 1.0' in metrics
        assert '"outcome": "error"' in next(tmp_path.glob("gateway-*-traces.jsonl")).read_text()   # always kept


def test_a_tool_slower_than_tool_timeout_ms_is_cut_off_and_counted_as_a_timeout(stack):
    weather = stack.settings("weather")
    timeouts = stack.metric("gateway", "gateway_tool_calls_total", tool="weather", outcome="timeout")
    stack.patch("weather", latency_ms=600, latency_sigma=0, tail_prob=0)
    stack.patch("gateway", tool_timeout_ms=150)
    try:
        stack.admin("gateway", "POST", {"level": "all"}, path="/admin/cache/flush")
        status, body = stack.query("what is the weather in Lisbon")
    finally:
        stack.patch("gateway", tool_timeout_ms=2000)
        stack.patch("weather", **weather)
    assert status == 200 and body["degraded"], body
    [call] = [c for c in body["tools"] if c["tool"] == "weather"]
    assert call["outcome"] == "timeout" and call["ended_s"] - call["started_s"] < 0.45, call   # cut at 0.15 s
    assert stack.metric("gateway", "gateway_tool_calls_total", tool="weather", outcome="timeout") == timeouts + 1


def test_an_llm_call_over_llm_timeout_ms_is_cut_off_and_the_query_fails(stack):
    stack.patch("gateway", llm_timeout_ms=1)
    try:
        status, body = stack.query("tell me a joke about timeouts")
    finally:
        stack.patch("gateway", llm_timeout_ms=30000)
    assert status == 502 and "TimeoutError" in body["error"], body
    assert stack.query("tell me a joke about timeouts")[0] == 200


@pytest.fixture(scope="module")
def llm_stack(tmp_path_factory):
    """A second stack whose inference server runs in LLM mode: the gateway streams from /v1/completions."""
    cfg = launcher.StackConfig.on_free_ports(tmp_path_factory.mktemp("llm-stack"),
                                             inference_args=launcher.SMALL_LLM_MODEL)
    state = launcher.start(cfg)
    try:
        yield StackClient(state)
    finally:
        launcher.stop(cfg.run_dir)


def stream_query(client: StackClient, text: str) -> tuple[float, list[tuple[float, dict]]]:
    """POST /query with stream true: (seconds to the first event, [(seconds, event)] up to [DONE])."""
    req = urllib.request.Request(client.state["query_url"], method="POST",
                                 data=json.dumps({"query": text, "stream": True}).encode(),
                                 headers={"Content-Type": "application/json"})
    sent, events = time.monotonic(), []
    with urllib.request.urlopen(req, timeout=60) as r:
        assert r.headers["Content-Type"].startswith("text/event-stream")
        for line in r:
            if line.startswith(b"data: "):
                if line.strip() == b"data: [DONE]":
                    break
                events.append((time.monotonic() - sent, json.loads(line[6:])))
    return events[0][0], events


def ttft_sums(client: StackClient) -> tuple[float, float]:
    return (client.metric("gateway", "gateway_time_to_first_token_seconds_sum"),
            client.metric("inference", "inference_time_to_first_token_seconds_sum"))


def test_a_streamed_query_arrives_token_by_token_and_each_hop_times_its_first_token(llm_stack):
    before = ttft_sums(llm_stack)
    first_s, events = stream_query(llm_stack, "tell me a joke")
    tokens = [e["token"] for _, e in events if "token" in e]
    answer = events[-1][1]
    assert len(tokens) == 16 and len(events) == 17          # OpenAI's default max_tokens, then the whole answer
    assert answer["answer"] == "".join(tokens) and answer["degraded"] is False
    assert events[0][0] < events[-2][0]                      # the first token came before the last
    gateway_s, inference_s = (a - b for a, b in zip(ttft_sums(llm_stack), before))
    # Each hop's clock starts when the request reaches it, after the hop before sent it.
    assert 0 < inference_s <= gateway_s <= first_s
    assert llm_stack.metric("gateway", "gateway_time_to_first_token_seconds_count") >= 1


def test_the_dimmer_asks_the_llm_path_for_degrade_max_tokens(llm_stack):
    llm_stack.patch("gateway", degrade_ratio=1.0, degrade_max_tokens=3)
    try:
        _, events = stream_query(llm_stack, "tell me a story")
        status, plain = llm_stack.query("tell me a longer story")
    finally:
        llm_stack.patch("gateway", degrade_ratio=0.0, degrade_max_tokens=4)
    assert len([e for _, e in events if "token" in e]) == 3 and events[-1][1]["degraded"] is True
    assert status == 200 and plain["degraded"] is True
    assert llm_stack.metric("inference", "inference_generation_tokens_total") >= 16 + 3 + 3


def test_the_llm_path_streams_through_the_tls_sidecar(llm_stack):
    before = llm_stack.metric("sidecar", "sidecar_request_duration_seconds_count")
    llm_stack.patch("gateway", llm_via_sidecar=True)
    try:
        _, events = stream_query(llm_stack, "how are you")
    finally:
        llm_stack.patch("gateway", llm_via_sidecar=False)
    assert len([e for _, e in events if "token" in e]) == 16
    assert llm_stack.metric("sidecar", "sidecar_request_duration_seconds_count") == before + 1


def test_streaming_needs_the_openai_api(stack):
    status, body = stack.http("POST", stack.state["query_url"], {"query": "hello", "stream": True})
    assert status == 400 and "--inference-api openai" in body["error"], body
