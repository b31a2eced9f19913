"""The inference server in LLM mode: its live settings, and the routes
POST /v1/completions, POST /v1/chat/completions (stream or not) and
GET /v1/models over the continuous-batching engine."""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

import torch
from aiohttp import web

from .. import faults
from ..model import Generator, ModelConfig
from ..paced import Pace
from ..service import make_app, token_file
from ..settings import Setting, SettingError, Settings, _shown
from .engine import Engine
from .metrics import LlmMetrics
from .openai_api import ApiError, CompletionRequest, Limits, answer, closing_events, event, parse, token_event
from .scheduler import POLICIES

# Context of the LLM mode's model unless --max-prompt-tokens / --max-new-tokens say otherwise.
MAX_PROMPT_TOKENS, MAX_NEW_TOKENS = 1024, 512
KV_CACHE_TOKENS = 16384
SERVED_MODEL_NAME = "reference-decoder"


class Choice(str):
    """The value of a ChoiceSetting; float() of it is its index among the choices (for the
    inference_setting gauge: scheduling_policy 0 = fcfs, 1 = priority)."""
    choices: tuple[str, ...] = ()

    def __float__(self) -> float:
        return float(self.choices.index(self))


def choice(value: str, choices: tuple[str, ...]) -> Choice:
    out = Choice(value)
    out.choices = choices
    return out


@dataclass(frozen=True)
class ChoiceSetting(Setting):
    """A setting that takes one of a few names."""
    choices: tuple[str, ...] = ()

    def check(self, value):
        if value not in self.choices:
            raise SettingError(f"{self.name}={_shown(value)} is not allowed; allowed: {', '.join(self.choices)}")
        return choice(value, self.choices)

    def bounds(self) -> list:
        return list(self.choices)


SETTINGS = [
    Setting("max_num_seqs", int, 1, 1024, 256, "most sequences in the running batch (vLLM's default 256)"),
    Setting("max_num_batched_tokens", int, 1, 65536, 2048,
            "most tokens one step runs, prefill chunks and decodes together (vLLM's default 2048)"),
    ChoiceSetting("scheduling_policy", str, 0, len(POLICIES) - 1, choice("fcfs", POLICIES),
                  "order of waiting and running sequences: fcfs (arrival) or priority (the request's priority "
                  "field, lower first)", POLICIES),
]


def build_app(args, cfg: ModelConfig, device: torch.device, settings: Settings,
              pace: Pace | None = None) -> web.Application:
    """settings: SETTINGS and the blocking_io_ms fault, with their values from --set; pace: each
    engine step timed by a clock instead of the model (--paced)."""
    generator = Generator(cfg, device)
    try:
        engine = Engine(generator.model, device, settings, args.kv_cache_tokens,
                        LlmMetrics(cuda=device.type == "cuda" and pace is None), pace)
    except ValueError as e:
        raise SystemExit(f"inference: --kv-cache-tokens: {e}") from None
    limits = Limits(args.served_model_name, cfg.max_prompt_tokens + cfg.max_new_tokens, args.kv_cache_tokens)
    scratch = args.run_dir / f"inference-{args.port}.blocking"

    async def complete(request: web.Request, chat: bool) -> web.StreamResponse:
        try:
            try:
                body = await request.json()
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise ApiError(400, "the body must be a JSON object (OpenAI's completion request)") from None
            req = parse(body, chat, limits)
        except ApiError as e:
            return e.response()
        faults.block_for(settings["blocking_io_ms"], scratch)
        loop = asyncio.get_running_loop()
        tokens: asyncio.Queue = asyncio.Queue()
        seq = engine.submit(req.prompt, req.max_tokens, req.priority,
                            lambda token, note: loop.call_soon_threadsafe(tokens.put_nowait, (token, note)))
        try:
            return await (stream(request, req, tokens) if req.stream else whole(req, tokens))
        finally:
            engine.abort(seq)              # nothing when it finished; frees its place when the client left

    async def whole(req: CompletionRequest, tokens: asyncio.Queue) -> web.Response:
        out = []
        while True:
            token, note = await tokens.get()
            if token is None:
                return ApiError(500, note, kind="server_error").response()
            out.append(token)
            if note:
                return web.json_response(answer(req, limits.model, generator.decode(out), len(out), note))

    async def stream(request: web.Request, req: CompletionRequest, tokens: asyncio.Queue) -> web.StreamResponse:
        """Headers go out with the first token (so the first response byte is the first token), then one
        event per token; the last token's event, the usage chunk and [DONE] go in one write."""
        token, note = await tokens.get()
        if token is None:
            return ApiError(500, note, kind="server_error").response()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        sent = 0
        while True:
            sent += 1
            data = token_event(req, limits.model, generator.decode([token]), sent == 1, note)
            await response.write(data + closing_events(req, limits.model, sent) if note else data)
            if note:
                break
            token, note = await tokens.get()
            if token is None:
                await response.write(event(ApiError(500, note, kind="server_error").body()))
                break
        await response.write_eof()
        return response

    async def completions(request):
        return await complete(request, chat=False)

    async def chat_completions(request):
        return await complete(request, chat=True)

    async def models(_request):
        return web.json_response({"object": "list", "data": [{"id": limits.model, "object": "model", "created": 0,
                                                              "owned_by": "slotune", "max_model_len": limits.max_model_len}]})

    async def start():
        args.run_dir.mkdir(parents=True, exist_ok=True)
        engine.start()

    async def stop():
        await asyncio.get_running_loop().run_in_executor(None, engine.stop)

    app = make_app("inference", settings, token_file(args), start, stop)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", models)
    return app
