"""What every stack service shares: /healthz, /metrics, the control API
(GET/PATCH /admin/config behind a bearer token, loopback peers only), the
<service>_setting gauges, logging, and running the aiohttp app."""
from __future__ import annotations

import argparse
import asyncio
import hmac
import ipaddress
import json
import logging
import os
import signal
import ssl
import sys
from pathlib import Path
from typing import Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, Gauge, generate_latest

from .settings import Setting, SettingError, Settings, parse_assignments

# Latency buckets of the services' request histograms: 50 ms apart from 0.2 s to 0.8 s,
# where the demo's SLOs (0.5 s, 0.6 s) and the throttle's aim (80 % of them) lie, so a
# P99 read from them moves with the load (with 0.3, 0.5, 0.75 alone, a tuner read 498 ms
# at every load from the bucket's edge, and 746 ms for anything past it).
LATENCY_BUCKETS = (.005, .01, .025, .05, .075, .1, .15, .2, .25, .3, .35, .4, .45, .5, .55, .6, .65, .7, .75, .8,
                   .9, 1, 1.5, 2, 3, 5, 10)

DEFAULT_RUN_DIR = Path(os.environ.get("SLOTUNE_STACK_RUN_DIR", "/tmp/slotune-stack"))
MAX_BODY_BYTES = 1 << 20      # of a request; a settings change is a small JSON object


def common_arguments(parser: argparse.ArgumentParser, port: int | None) -> None:
    parser.add_argument("--host", default=os.environ.get("SLOTUNE_STACK_HOST", "127.0.0.1"),
                        help="address to listen on (default 127.0.0.1; the control API refuses non-loopback peers)")
    parser.add_argument("--port", type=int, default=port,
                        help=f"TCP port (default {port if port else 'the one named in the service table'})")
    parser.add_argument("--run-dir", type=Path, default=DEFAULT_RUN_DIR,
                        help="where the token, certificate and scratch files live (default /tmp/slotune-stack, "
                             "env SLOTUNE_STACK_RUN_DIR)")
    parser.add_argument("--token-file", type=Path, default=None,
                        help="file holding the control API bearer token (default <run dir>/admin.token)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="initial value of a setting (repeatable)")


def token_file(args) -> Path:
    return args.token_file or args.run_dir / "admin.token"


def load_settings(specs: list[Setting], args) -> Settings:
    try:
        return Settings(specs, parse_assignments(args.set))
    except SettingError as e:
        raise SystemExit(f"--set: {e}") from None


def _json_int(digits: str) -> int | float:
    """A JSON integer; one longer than Python converts reads as a float (infinity) for the setting to refuse."""
    return int(digits) if len(digits) <= sys.get_int_max_str_digits() else float(digits)


def json_error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def _is_loopback(remote: str | None) -> bool:
    if not remote:            # a Unix socket has no peer address
        return True
    try:
        return ipaddress.ip_address(remote.split("%")[0]).is_loopback
    except ValueError:
        return False


def admin_guard(token_path: Path) -> Callable[[Callable], Callable]:
    """Decorates admin handlers: 403 for non-loopback peers, 401 without the right bearer token."""
    def wrap(handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):
        async def guarded(request: web.Request) -> web.StreamResponse:
            if not _is_loopback(request.remote):
                return json_error(403, f"the control API answers loopback peers only, not {request.remote}")
            try:
                want = token_path.read_text().strip()
            except OSError as e:
                return json_error(500, f"cannot read the token file {token_path}: {e.strerror}")
            got = request.headers.get("Authorization", "")
            if not want or not hmac.compare_digest(got.encode(), f"Bearer {want}".encode()):
                return json_error(401, f"missing or wrong bearer token (the token is in {token_path})")
            return await handler(request)
        return guarded
    return wrap


def make_app(service: str, settings: Settings, token_path: Path, start: Callable[[], Awaitable[None]] | None = None,
             stop: Callable[[], Awaitable[None]] | None = None) -> web.Application:
    """An app with /healthz, /metrics and /admin/config; the service adds its own routes.
    start() runs before the first request, stop() at shutdown."""
    gauge = Gauge(f"{service}_setting", f"current value of each {service} setting", ["setting"])

    def export(values):
        for key, value in values.items():
            gauge.labels(key).set(float(value))

    export(settings.snapshot())
    settings.on_change(export)
    guard = admin_guard(token_path)

    async def healthz(_request):
        return web.json_response({"service": service, "ok": True})

    async def metrics(_request):
        return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    @guard
    async def get_config(_request):
        return web.json_response({"settings": settings.snapshot(), "bounds": settings.bounds(),
                                  "help": {name: spec.help for name, spec in settings.specs.items()}})

    @guard
    async def patch_config(request):
        try:
            body = await request.json(loads=lambda text: json.loads(text, parse_int=_json_int))
        except web.HTTPRequestEntityTooLarge:
            return json_error(413, f"the body is larger than {MAX_BODY_BYTES} bytes; "
                                   "send a JSON object of setting -> value")
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
            return json_error(400, "the body must be a JSON object of setting -> value")
        try:
            after = settings.patch(body)
        except SettingError as e:
            return json_error(400, str(e))
        return web.json_response({"settings": after, "bounds": settings.bounds()})

    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app["settings"] = settings
    app["admin_guard"] = guard
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/admin/config", get_config)
    app.router.add_patch("/admin/config", patch_config)
    if start:
        app.on_startup.append(lambda _app: start())
    if stop:
        app.on_cleanup.append(lambda _app: stop())
    return app


def serve(app: web.Application, host: str, sites: list[tuple[int, ssl.SSLContext | None]]) -> None:
    """Serve app on each (port, TLS context or None) until SIGTERM or SIGINT."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    async def main():
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            for port, ctx in sites:
                await web.TCPSite(runner, host, port, ssl_context=ctx, backlog=1024).start()
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop.set)
            await stop.wait()
        finally:
            await runner.cleanup()

    asyncio.run(main())
