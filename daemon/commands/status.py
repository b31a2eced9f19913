"""`slotune status`: the running daemon's per-service table (daemon/export/status_table.py),
refreshed in place in a terminal."""
from __future__ import annotations

import sys
import time
import urllib.request

from slotune.export.status_table import render
from slotune.host import untrusted

NAME = "status"
HELP = "show the running daemon's live per-service table (P99 vs SLO, top cause, settings, decisions)"
EXAMPLES = """  slotune status
  slotune status --once                      # print one table and exit (scripts, CI logs)
  slotune status --url http://127.0.0.1:9477 --every 5
"""


def add_arguments(parser) -> None:
    parser.add_argument("--url", default="http://127.0.0.1:9477", help="the daemon's exporter address")
    parser.add_argument("--once", action="store_true", help="print one table and exit")
    parser.add_argument("--every", type=float, default=2.0, help="refresh period in seconds")


MAX_STATUS_BYTES = 8 << 20      # a daemon's /status is ~1 kB a service


def fetch(url: str) -> dict:
    """The daemon's /status; Untrusted when what answers there is not one (whatever holds the port)."""
    with urllib.request.urlopen(url.rstrip("/") + "/status", timeout=3) as resp:
        status = untrusted.json_value(resp.read(MAX_STATUS_BYTES + 1), f"{url}/status", MAX_STATUS_BYTES)
    if not (isinstance(status, dict) and isinstance(status.get("services"), dict)
            and isinstance(status.get("decisions"), list)):
        raise untrusted.Untrusted(f"{url}/status is not a slotune daemon's status")
    return status


def run(args) -> int:
    if args.every <= 0:
        print("slotune status: --every must be > 0 seconds", file=sys.stderr)
        return 2
    while True:
        try:
            table = render(fetch(args.url))
        except OSError as exc:
            print(f"slotune status: no daemon answers at {args.url} ({exc}); is `slotune run` up?", file=sys.stderr)
            return 1
        except (untrusted.Untrusted, KeyError, TypeError, AttributeError) as exc:
            print(f"slotune status: {untrusted.inert(str(exc))[:200]}: is that the daemon's exporter_address?",
                  file=sys.stderr)
            return 1
        if args.once or not sys.stdout.isatty():
            print(table)
            if args.once:
                return 0
        else:
            print("\033[H\033[2J" + table, flush=True)
        time.sleep(args.every)
