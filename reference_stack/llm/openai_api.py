"""OpenAI's wire format for POST /v1/completions and /v1/chat/completions:
reading a request into prompt tokens and limits, and writing the answer, the
server-sent-event chunks of a stream and errors in OpenAI's error shape."""
from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

COMPLETIONS_MAX_TOKENS = 16      # OpenAI's documented default for /v1/completions; chat fills the context


class ApiError(Exception):
    """A request OpenAI's API would refuse: HTTP status, message, the offending parameter, a code."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}

    def response(self) -> web.Response:
        return web.json_response(self.body(), status=self.status)


@dataclass
class Limits:
    model: str                   # the served model's name
    max_model_len: int           # prompt + output tokens one sequence may hold
    kv_cache_tokens: int         # a sequence must fit the whole cache alone


@dataclass
class CompletionRequest:
    chat: bool
    prompt: list[int]
    max_tokens: int
    stream: bool
    include_usage: bool
    priority: int
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))


def chat_prompt(messages: Any) -> str:
    """The model's chat template: each message as <|role|>content on its own line, then <|assistant|>."""
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty array of {role, content}", "messages")
    lines = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError(400, f"messages[{i}] must be an object with a role and content", f"messages[{i}]")
        content = m.get("content")
        if isinstance(content, list):            # content parts: only text parts carry tokens here
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
        if not isinstance(content, str):
            raise ApiError(400, f"messages[{i}].content must be a string or an array of text parts",
                           f"messages[{i}].content")
        lines.append(f"<|{m['role']}|>{content}\n")
    return "".join(lines) + "<|assistant|>"


def completion_prompt(prompt: Any) -> list[int]:
    """A prompt as tokens (UTF-8 bytes): a string, a one-string array, or an array of token ids 0..255."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return list(prompt.encode("utf-8"))
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 256
                                                   for t in prompt):
        return prompt
    raise ApiError(400, "prompt must be a string, an array of one string, or an array of token ids in "
                        "[0, 255] (this server serves one prompt per request)", "prompt")


def _integer(body: dict, key: str, default: int | None, low: int) -> int | None:
    value = body.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ApiError(400, f"{key}={value!r} must be an integer >= {low}", key)
    return value


def parse(body: Any, chat: bool, limits: Limits) -> CompletionRequest:
    """The request, or ApiError naming the parameter at fault."""
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str):
        raise ApiError(400, "model is required: the name of the served model "
                            f"({limits.model!r}; GET /v1/models lists it)", "model")
    if model != limits.model:
        raise ApiError(404, f"The model `{model}` does not exist; this server serves `{limits.model}`",
                       "model", "model_not_found")
    prompt = list(chat_prompt(body.get("messages")).encode("utf-8")) if chat else completion_prompt(body.get("prompt"))
    if _integer(body, "n", 1, 1) != 1:
        raise ApiError(400, "n must be 1 (this server returns one choice)", "n")
    room = limits.max_model_len - len(prompt)
    key = "max_completion_tokens" if chat and "max_completion_tokens" in body else "max_tokens"
    max_tokens = _integer(body, key, None if chat else COMPLETIONS_MAX_TOKENS, 1)
    if max_tokens is None:
        max_tokens = room
    if room < 1 or max_tokens > room:
        raise ApiError(400, f"This model's maximum context length is {limits.max_model_len} tokens; the prompt "
                            f"has {len(prompt)} and {key} asks for {max_tokens}. Shorten the prompt or lower "
                            f"{key}.", "messages" if chat else "prompt", "context_length_exceeded")
    if len(prompt) + max_tokens > limits.kv_cache_tokens:
        raise ApiError(400, f"the prompt ({len(prompt)} tokens) and {key} ({max_tokens}) exceed the KV cache "
                            f"({limits.kv_cache_tokens} tokens, --kv-cache-tokens)", key, "context_length_exceeded")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ApiError(400, f"stream={stream!r} must be true or false", "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise ApiError(400, "stream_options must be an object such as {\"include_usage\": true}", "stream_options")
    priority = body.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ApiError(400, f"priority={priority!r} must be an integer (lower is served first under the "
                            "priority scheduling policy)", "priority")
    return CompletionRequest(chat, prompt, max_tokens, stream, bool(options.get("include_usage")), priority)


def usage(req: CompletionRequest, completion_tokens: int) -> dict:
    return {"prompt_tokens": len(req.prompt), "completion_tokens": completion_tokens,
            "total_tokens": len(req.prompt) + completion_tokens}


def _envelope(req: CompletionRequest, model: str, stream: bool) -> dict:
    if req.chat:
        return {"id": f"chatcmpl-{req.id}", "object": "chat.completion.chunk" if stream else "chat.completion",
                "created": req.created, "model": model}
    return {"id": f"cmpl-{req.id}", "object": "text_completion", "created": req.created, "model": model}


def answer(req: CompletionRequest, model: str, text: str, tokens: int, finish_reason: str) -> dict:
    """The whole answer of a stream: false request."""
    if req.chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                  "finish_reason": finish_reason}
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
    return {**_envelope(req, model, False), "choices": [choice], "usage": usage(req, tokens)}


def token_event(req: CompletionRequest, model: str, text: str, first: bool, finish_reason: str | None) -> bytes:
    """One server-sent event carrying one token; the first chat chunk also names the role, the last
    carries the finish reason."""
    if req.chat:
        delta = {"role": "assistant", "content": text} if first else {"content": text}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
    chunk = {**_envelope(req, model, True), "choices": [choice]}
    if req.include_usage:
        chunk["usage"] = None
    return event(chunk)


def closing_events(req: CompletionRequest, model: str, tokens: int) -> bytes:
    """After the last token: the usage chunk when stream_options.include_usage asked for it, then [DONE]."""
    tail = event({**_envelope(req, model, True), "choices": [], "usage": usage(req, tokens)}) if req.include_usage else b""
    return tail + b"data: [DONE]\n\n"


def event(data: dict) -> bytes:
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"
