"""The `slotune` command line: finds every subcommand module in
daemon.commands and gives each its own parser, help text and examples."""
from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from slotune import commands

EXAMPLES = """examples:
  slotune doctor                      check this host before trusting the daemon
  slotune doctor --redis-url redis://127.0.0.1:6379
  slotune discover --write FILE       a starter config for the services this host runs
  slotune <command> --help            every command ends with its own examples
"""


def subcommand_modules():
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda i: i.name):
        yield importlib.import_module(f"{commands.__name__}.{info.name}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slotune",
        description="eBPF + NVML host daemon: attributes tail latency of agent and inference "
                    "services to measured causes and tunes their settings in a closed loop.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in subcommand_modules():
        p = sub.add_parser(module.NAME, help=module.HELP, description=module.HELP,
                           epilog="examples:\n" + module.EXAMPLES,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(p)
        p.set_defaults(run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
