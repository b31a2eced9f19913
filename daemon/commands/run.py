"""`slotune run`: the daemon itself (what systemd starts)."""
from __future__ import annotations

import logging
import sys

from slotune import config
from slotune.host.untrusted import InertFormatter

NAME = "run"
HELP = "run the daemon: collect, attribute, tune and export until SIGTERM (SIGHUP reloads the config)"
EXAMPLES = """  slotune run --config /etc/slotune/slotune.toml
  slotune run --config slotune.example.toml --dry-run      # decide and export, push nothing
  slotune run --config slotune.toml --log-level debug
"""


def add_arguments(parser) -> None:
    parser.add_argument("--config", default=str(config.DEFAULT_PATH), help="TOML file (default: %(default)s)")
    parser.add_argument("--dry-run", action="store_true", help="compute and export decisions, push nothing")
    parser.add_argument("--restore-on-exit", action="store_true",
                        help="on a clean stop, put back the values in force before slotune first changed them")
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))


def run(args) -> int:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(InertFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=args.log_level.upper(), handlers=[handler])
    try:
        cfg = config.load(args.config)
    except config.ConfigError as exc:
        print(f"slotune: bad config: {exc}", file=sys.stderr)
        return 2
    from slotune.process import Daemon
    try:
        daemon = Daemon(cfg, dry_run=args.dry_run, restore_on_exit=args.restore_on_exit)
        daemon.handle_signals()
        daemon.start()
    except OSError as exc:
        print(f"slotune: cannot start: {exc}", file=sys.stderr)
        return 1
    daemon.run_forever()
    return 0
