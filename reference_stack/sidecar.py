"""The TLS sidecar: terminates TLS in front of the inference server and forwards
over pooled plaintext connections. With reuse_connections=false it closes every
client connection after one answer, so each request pays a fresh TCP + TLS
handshake: the service-mesh jitter scenario. It forwards /generate and, for a
server in LLM mode, /v1/completions and /v1/chat/completions, passing a
streamed answer (server-sent events) on chunk by chunk as it comes."""
from __future__ import annotations

import argparse
import ssl
import time

import aiohttp
from aiohttp import web
from prometheus_client import REGISTRY, Histogram
from prometheus_client.core import CounterMetricFamily

from .ports import port
from .service import common_arguments, json_error, load_settings, make_app, serve, token_file
from .settings import Setting

PORT = port("sidecar")
ADMIN_PORT = port("sidecar_admin")
SETTINGS = [
    Setting("reuse_connections", bool, 0, 1, True,
            "keep client TLS connections alive; false closes each after one answer (a handshake per request)"),
]
ROUTES = ("/generate", "/v1/completions", "/v1/chat/completions")
REQUEST = Histogram("sidecar_request_duration_seconds", "time from request to forwarded answer",
                    buckets=(.005, .01, .025, .05, .075, .1, .15, .2, .3, .5, .75, 1, 1.5, 2, 3, 5, 10))


class HandshakeCounter:
    """sidecar_handshakes_total, read at scrape time from OpenSSL's count of completed server handshakes."""

    def __init__(self, ctx: ssl.SSLContext):
        self.ctx = ctx

    def collect(self):
        yield CounterMetricFamily("sidecar_handshakes", "TLS handshakes completed (full: tickets are off)",
                                  value=self.ctx.session_stats()["accept_good"])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common_arguments(parser, PORT)
    parser.add_argument("--admin-port", type=int, default=ADMIN_PORT,
                        help=f"plaintext port for /metrics, /healthz and /admin/config (default {ADMIN_PORT}; "
                             "the TLS port serves them too)")
    parser.add_argument("--upstream", default=f"http://127.0.0.1:{port('inference')}", help="plaintext upstream (the inference server)")
    parser.add_argument("--cert", default=None, help="certificate PEM (default <run dir>/tls.crt)")
    parser.add_argument("--key", default=None, help="private key PEM (default <run dir>/tls.key)")


def server_context(cert: str, key: str) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as e:
        raise SystemExit(f"sidecar: cannot load certificate {cert} / key {key}: {e}; "
                         "`python -m reference_stack init` creates them") from None
    ctx.options |= ssl.OP_NO_TICKET          # no session resumption: each new connection is a full handshake
    return ctx


def build_app(args, ctx: ssl.SSLContext) -> web.Application:
    settings = load_settings(SETTINGS, args)
    upstream = args.upstream.rstrip("/")
    REGISTRY.register(HandshakeCounter(ctx))
    session: dict[str, aiohttp.ClientSession] = {}

    def keep_alive(resp: web.StreamResponse) -> None:
        if not settings["reuse_connections"]:
            resp.force_close()

    async def forward(request: web.Request) -> web.StreamResponse:
        started = time.monotonic()
        if not request.secure:
            return json_error(421, f"sidecar: {request.path} is served over TLS only, on port {args.port}")
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("content-type", "accept")}
        resp = None
        try:
            async with session["up"].request(request.method, upstream + request.rel_url.path_qs,
                                             data=body, headers=headers) as up:
                kind = up.headers.get("Content-Type", "application/json")
                if kind.startswith("text/event-stream"):
                    resp = web.StreamResponse(status=up.status, headers={"Content-Type": kind})
                    keep_alive(resp)
                    await resp.prepare(request)
                    async for chunk in up.content.iter_any():
                        await resp.write(chunk)
                    await resp.write_eof()
                else:
                    resp = web.Response(body=await up.read(), status=up.status, headers={"Content-Type": kind})
        except aiohttp.ClientError as e:
            if resp is not None and resp.prepared:      # cut mid-stream: the client sees the stream end early
                raise
            resp = json_error(502, f"sidecar: upstream {upstream} failed: {e}")
        keep_alive(resp)
        REQUEST.observe(time.monotonic() - started)
        return resp

    async def start():
        session["up"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256),
                                              timeout=aiohttp.ClientTimeout(total=30))

    async def stop():
        await session["up"].close()

    app = make_app("sidecar", settings, token_file(args), start, stop)
    for route in ROUTES:
        app.router.add_route("*", route, forward)
    return app


def run(args) -> int:
    cert = args.cert or str(args.run_dir / "tls.crt")
    key = args.key or str(args.run_dir / "tls.key")
    ctx = server_context(cert, key)
    serve(build_app(args, ctx), args.host, [(args.port, ctx), (args.admin_port, None)])
    return 0
