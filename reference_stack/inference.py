"""The inference server: POST /generate {"prompt", "max_new_tokens"?} runs the
decoder through the dynamic batcher and answers {"text", "tokens",
"batch_size", "queue_wait_s"}. CUDA when torch sees a GPU, CPU otherwise."""
from __future__ import annotations

import argparse
import os
import time

import torch
from aiohttp import web
from prometheus_client import Counter, Gauge, Histogram

from . import faults
from .batcher import Batcher
from .model import Generator, ModelConfig, pick_device
from .ports import port
from .service import common_arguments, json_error, load_settings, make_app, serve, token_file
from .settings import Setting

PORT = port("inference")
SETTINGS = [
    Setting("max_batch_size", int, 1, 128, 8, "most requests run together in one batch"),
    Setting("max_queue_delay_ms", float, 0, 1000, 5.0, "longest the oldest queued request waits for a batch to fill"),
    Setting("blocking_io_ms", float, 0, 1000, 0.0,
            "fault: ms of blocking write+fsync+clock_nanosleep on the event-loop thread per request"),
]

LATENCY_BUCKETS = (.005, .01, .025, .05, .075, .1, .15, .2, .3, .5, .75, 1, 1.5, 2, 3, 5, 10)
REQUEST = Histogram("inference_request_duration_seconds", "time from request to answer", buckets=LATENCY_BUCKETS)
QUEUE_WAIT = Histogram("inference_queue_wait_seconds", "time a request waits for its batch to start",
                       buckets=LATENCY_BUCKETS)
BATCH_SIZE = Histogram("inference_batch_size", "requests per executed batch",
                       buckets=(1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128))
BATCH_COMPUTE = Histogram("inference_batch_compute_seconds", "model time per batch", buckets=LATENCY_BUCKETS)
TOKENS = Counter("inference_tokens_total", "tokens generated")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common_arguments(parser, PORT)
    defaults = ModelConfig()
    parser.add_argument("--device", default=os.environ.get("SLOTUNE_STACK_DEVICE", "auto"),
                        help="auto (CUDA if present, else CPU), cpu, cuda or cuda:N")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--d-model", type=int, default=defaults.d_model)
    parser.add_argument("--layers", type=int, default=defaults.n_layers)
    parser.add_argument("--heads", type=int, default=defaults.n_heads)
    parser.add_argument("--max-prompt-tokens", type=int, default=defaults.max_prompt_tokens)
    parser.add_argument("--max-new-tokens", type=int, default=defaults.max_new_tokens)


def build_app(args) -> web.Application:
    torch.set_num_threads(args.threads)
    settings = load_settings(SETTINGS, args)
    try:
        cfg = ModelConfig(d_model=args.d_model, n_layers=args.layers, n_heads=args.heads,
                          max_prompt_tokens=args.max_prompt_tokens, max_new_tokens=args.max_new_tokens)
        device = pick_device(args.device)
    except ValueError as e:
        raise SystemExit(f"inference: {e}") from None
    generator = Generator(cfg, device)
    gpu_memory = (Gauge("inference_gpu_memory_bytes", "CUDA memory the model server holds "
                        "(torch.cuda.memory_reserved)") if device.type == "cuda" else None)
    scratch = args.run_dir / f"inference-{args.port}.blocking"

    def run_batch(payloads):
        outs = generator.generate([p for p, _ in payloads], [n for _, n in payloads])
        if gpu_memory is not None:
            torch.cuda.synchronize(device)
            gpu_memory.set(torch.cuda.memory_reserved(device))
        return outs

    def on_batch(size, compute_s):
        BATCH_SIZE.observe(size)
        BATCH_COMPUTE.observe(compute_s)

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
        TOKENS.inc(len(done.result))
        QUEUE_WAIT.observe(done.queue_wait_s)
        REQUEST.observe(time.monotonic() - started)
        return web.json_response({"text": generator.decode(done.result), "tokens": len(done.result),
                                  "batch_size": done.batch_size, "queue_wait_s": done.queue_wait_s,
                                  "device": str(device)})

    async def start():
        args.run_dir.mkdir(parents=True, exist_ok=True)
        generator.generate(["warm up"], [2])
        batcher.start()

    app = make_app("inference", settings, token_file(args), start, batcher.stop)
    app.router.add_post("/generate", generate)
    return app


def run(args) -> int:
    serve(build_app(args), args.host, [(args.port, None)])
    return 0
