"""The inference server, in one of two modes chosen at start. generate (the
default): POST /generate {"prompt", "max_new_tokens"?} runs the decoder through
the request-level dynamic batcher and answers {"text", "tokens", "batch_size",
"queue_wait_s"}. llm: OpenAI-compatible completions over continuous batching
(reference_stack/llm/). CUDA when torch sees a GPU, CPU otherwise. --paced: no
model, each batch (generate) or engine step (llm) timed by a clock
(reference_stack/paced.py), for a capacity that is the same on every host."""
from __future__ import annotations

import argparse
import os
import time

import torch
from aiohttp import web
from prometheus_client import Counter, Gauge, Histogram

from . import faults
from .batcher import Batcher
from .llm import server as llm_server
from .model import Generator, ModelConfig, pick_device
from .paced import Pace
from .ports import port
from .service import LATENCY_BUCKETS, common_arguments, json_error, load_settings, make_app, serve, token_file
from .settings import Setting

PORT = port("inference")
BLOCKING_IO = Setting("blocking_io_ms", float, 0, 1000, 0.0,
                      "fault: ms of blocking write+fsync+clock_nanosleep on the event-loop thread per request")
SETTINGS = [
    Setting("max_batch_size", int, 1, 128, 8, "most requests run together in one batch"),
    Setting("max_queue_delay_ms", float, 0, 1000, 5.0, "longest the oldest queued request waits for a batch to fill"),
    BLOCKING_IO,
]

MODES = ("generate", "llm")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common_arguments(parser, PORT)
    defaults = ModelConfig()
    parser.add_argument("--mode", choices=MODES, default="generate",
                        help="generate: POST /generate over the request-level batcher (default); "
                             "llm: OpenAI-compatible /v1/completions and /v1/chat/completions over continuous batching")
    parser.add_argument("--device", default=os.environ.get("SLOTUNE_STACK_DEVICE", "auto"),
                        help="auto (CUDA if present, else CPU), cpu, cuda or cuda:N")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--d-model", type=int, default=defaults.d_model)
    parser.add_argument("--layers", type=int, default=defaults.n_layers)
    parser.add_argument("--heads", type=int, default=defaults.n_heads)
    parser.add_argument("--max-prompt-tokens", type=int, default=None,
                        help=f"generate: prompts are cut to their last N tokens (default {defaults.max_prompt_tokens}); "
                             f"llm: with --max-new-tokens, the context a sequence may hold "
                             f"(default {llm_server.MAX_PROMPT_TOKENS})")
    parser.add_argument("--max-new-tokens", type=int, default=None,
                        help=f"generate: most tokens an answer gets (default {defaults.max_new_tokens}); "
                             f"llm: see --max-prompt-tokens (default {llm_server.MAX_NEW_TOKENS})")
    parser.add_argument("--kv-cache-tokens", type=int, default=llm_server.KV_CACHE_TOKENS,
                        help=f"llm: the KV cache's capacity in tokens over all sequences (default "
                             f"{llm_server.KV_CACHE_TOKENS}); when full, the newest sequence is preempted")
    parser.add_argument("--paced", metavar="STEP_MS,PER_SEQ_MS[,JITTER]", default=None,
                        help="no model; generate: a batch takes its longest answer's tokens x (STEP_MS + "
                             "PER_SEQ_MS x its size) ms of a clock, llm: each engine step STEP_MS + PER_SEQ_MS "
                             "x its sequences, times 1 + JITTER x a seeded normal draw: a capacity that is the "
                             "same on every host (tests)")
    parser.add_argument("--served-model-name", default=llm_server.SERVED_MODEL_NAME,
                        help=f"llm: the model name requests must give (default {llm_server.SERVED_MODEL_NAME})")


def build_app(args) -> web.Application:
    torch.set_num_threads(args.threads)
    llm = args.mode == "llm"
    defaults = ModelConfig()
    try:
        cfg = ModelConfig(d_model=args.d_model, n_layers=args.layers, n_heads=args.heads,
                          max_prompt_tokens=_given(args.max_prompt_tokens, llm_server.MAX_PROMPT_TOKENS if llm
                                                   else defaults.max_prompt_tokens),
                          max_new_tokens=_given(args.max_new_tokens, llm_server.MAX_NEW_TOKENS if llm
                                                else defaults.max_new_tokens))
        device = pick_device(args.device)
    except ValueError as e:
        raise SystemExit(f"inference: {e}") from None
    try:
        pace = Pace.parse(args.paced) if args.paced else None
    except ValueError as e:
        raise SystemExit(f"inference: {e}") from None
    if llm:
        return llm_server.build_app(args, cfg, device, load_settings(llm_server.SETTINGS + [BLOCKING_IO], args), pace)
    return _generate_app(args, cfg, device, pace)


def _given(value: int | None, default: int) -> int:
    return default if value is None else value


def _generate_app(args, cfg: ModelConfig, device: torch.device, pace: Pace | None) -> web.Application:
    settings = load_settings(SETTINGS, args)
    request_time = Histogram("inference_request_duration_seconds", "time from request to answer", buckets=LATENCY_BUCKETS)
    queue_wait = Histogram("inference_queue_wait_seconds", "time a request waits for its batch to start",
                           buckets=LATENCY_BUCKETS)
    batch_size = Histogram("inference_batch_size", "requests per executed batch",
                           buckets=(1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128))
    batch_compute = Histogram("inference_batch_compute_seconds", "model time per batch", buckets=LATENCY_BUCKETS)
    tokens_total = Counter("inference_tokens_total", "tokens generated")
    generator = Generator(cfg, device) if pace is None else None
    gpu_memory = (Gauge("inference_gpu_memory_bytes", "CUDA memory the model server holds "
                        "(torch.cuda.memory_reserved)") if device.type == "cuda" and pace is None else None)
    scratch = args.run_dir / f"inference-{args.port}.blocking"

    def run_batch(payloads):
        if pace is not None:
            return pace.run([max(1, min(n, cfg.max_new_tokens)) for _, n in payloads])   # as the model does
        outs = generator.generate([p for p, _ in payloads], [n for _, n in payloads])
        if gpu_memory is not None:
            torch.cuda.synchronize(device)
            gpu_memory.set(torch.cuda.memory_reserved(device))
        return outs

    def on_batch(size, compute_s):
        batch_size.observe(size)
        batch_compute.observe(compute_s)

    batcher = Batcher(settings, run_batch, on_batch)

    async def generate(request: web.Request) -> web.Response:
        started = time.monotonic()
        try:
            body = await request.json()
            prompt = str(body["prompt"])
            new_tokens = int(body.get("max_new_tokens", cfg.max_new_tokens))
        except (ValueError, KeyError, TypeError):
            return json_error(400, 'the body must be JSON {"prompt": str, "max_new_tokens"?: int}')
        faults.block_for(settings["blocking_io_ms"], scratch)
        done = await batcher.submit((prompt, new_tokens))
        tokens_total.inc(len(done.result))
        queue_wait.observe(done.queue_wait_s)
        request_time.observe(time.monotonic() - started)
        text = "x" * len(done.result) if generator is None else generator.decode(done.result)
        return web.json_response({"text": text, "tokens": len(done.result), "batch_size": done.batch_size,
                                  "queue_wait_s": done.queue_wait_s, "device": "paced" if pace else str(device)})

    async def start():
        args.run_dir.mkdir(parents=True, exist_ok=True)
        if generator is not None:
            generator.generate(["warm up"], [2])
        batcher.start()

    app = make_app("inference", settings, token_file(args), start, batcher.stop)
    app.router.add_post("/generate", generate)
    return app


def run(args) -> int:
    serve(build_app(args), args.host, [(args.port, None)])
    return 0
