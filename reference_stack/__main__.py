"""`python -m reference_stack <command>`: up, down, init, status, load, or one
service (gateway, inference, tool, sidecar) in the foreground."""
from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

from . import launcher
from .service import DEFAULT_RUN_DIR

SERVICES = {"gateway": "gateway", "inference": "inference", "tool": "tools", "sidecar": "sidecar", "load": "loadgen"}
HELP = {"gateway": "run the agent gateway in the foreground", "inference": "run the inference server in the foreground",
        "tool": "run one tool server in the foreground", "sidecar": "run the TLS sidecar in the foreground",
        "load": "open-loop load, printing its quantiles: the gateway's /query (default) or, with --workload llm, "
                "streaming completions to an inference server in LLM mode (TTFT, TPOT, goodput)"}
EXAMPLES = """examples:
  python -m reference_stack up                       # whole stack on 8080/8100/8201-8203/8443, Redis on 6390
  python -m reference_stack up --llm                 # the inference server in LLM mode, the gateway streaming
  python -m reference_stack load --workload llm --rate 1 --duration 20 --slo-ttft-ms 500 --slo-tpot-ms 50
  python -m reference_stack load --rate 30 --duration 60 --profile step --csv /tmp/load.csv
  python -m reference_stack down
  python -m reference_stack up --set inference.max_batch_size=16 --set search.failure_rate=0.2
"""


def _up_arguments(p: argparse.ArgumentParser) -> None:
    d = launcher.StackConfig()
    p.add_argument("--run-dir", type=Path, default=DEFAULT_RUN_DIR,
                   help=f"state, token, certificate and logs (default {DEFAULT_RUN_DIR}; env SLOTUNE_STACK_RUN_DIR)")
    for name in ("gateway", "inference", "sidecar", "sidecar_admin", "redis"):
        flag = "--" + name.replace("_", "-") + "-port"
        p.add_argument(flag, type=int, default=getattr(d, f"{name}_port"),
                       help=f"default {getattr(d, f'{name}_port')} (env SLOTUNE_STACK_{name.upper()}_PORT)")
    p.add_argument("--tool-port", action="append", default=[], metavar="NAME=PORT",
                   help="a tool's port (defaults: " + ", ".join(f"{n} {p}" for n, p in d.tool_ports.items()) +
                        "; env SLOTUNE_STACK_<NAME>_PORT)")
    p.add_argument("--set", action="append", default=[], metavar="SERVICE.KEY=VALUE",
                   help="initial setting; SERVICE is gateway, inference, sidecar or a tool's name")
    p.add_argument("--device", default="auto", help="inference device: auto, cpu, cuda, cuda:N")
    p.add_argument("--llm", action="store_true",
                   help="start the inference server in LLM mode (--mode llm: OpenAI-compatible streaming "
                        "completions, continuous batching); the gateway then streams from it")


def _config(args) -> launcher.StackConfig:
    cfg = launcher.StackConfig(run_dir=args.run_dir, gateway_port=args.gateway_port,
                               inference_port=args.inference_port, sidecar_port=args.sidecar_port,
                               sidecar_admin_port=args.sidecar_admin_port, redis_port=args.redis_port,
                               inference_args=["--device", args.device, *(["--mode", "llm"] if args.llm else [])])
    for pair in args.tool_port:
        name, _, port = pair.partition("=")
        if name not in cfg.tool_ports or not port.isdigit():
            raise SystemExit(f"--tool-port {pair!r}: expected NAME=PORT, NAME one of {', '.join(cfg.tool_ports)}")
        cfg.tool_ports[name] = int(port)
    for item in args.set:
        target, _, value = item.partition("=")
        service, _, key = target.partition(".")
        if not (key and value) or service not in ("gateway", "inference", "sidecar", *cfg.tool_ports):
            raise SystemExit(f"--set {item!r}: expected SERVICE.KEY=VALUE, e.g. inference.max_batch_size=16")
        cfg.settings.setdefault(service, {})[key] = value
    return cfg


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reference_stack", description=__doc__, epilog=EXAMPLES,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    _up_arguments(sub.add_parser("up", help="start the whole stack in the background"))
    for name in ("down", "init", "status"):
        p = sub.add_parser(name, help={"down": "stop the stack started by up",
                                       "init": "create the run dir's admin token and TLS certificate",
                                       "status": "print the running stack's state and health"}[name])
        p.add_argument("--run-dir", type=Path, default=DEFAULT_RUN_DIR)
    argv = sys.argv[1:] if argv is None else argv
    for name, module in SERVICES.items():
        p = sub.add_parser(name, help=HELP[name])
        if argv[:1] == [name]:            # import only the chosen one: torch is slow to import
            chosen = importlib.import_module(f".{module}", __package__)
            chosen.add_arguments(p)
            p.set_defaults(run=chosen.run)
    args = parser.parse_args(argv)
    if hasattr(args, "run"):
        return args.run(args)
    try:
        if args.command == "up":
            state = launcher.start(_config(args))
            print(f"stack up: query {state['query_url']}; state {args.run_dir / launcher.STATE_FILE}; "
                  f"token {state['token_file']}; logs in {args.run_dir}")
            for name, url in state["urls"].items():
                print(f"  {name:<10} pid {state['pids'][name]:<8} {url}")
            print(f"  {'redis':<10} pid {state['pids']['redis']:<8} redis://127.0.0.1:{state['redis_port']}/0")
        elif args.command == "down":
            print("stopped: " + (", ".join(launcher.stop(args.run_dir)) or "nothing was running"))
        elif args.command == "init":
            print(json.dumps({k: str(v) for k, v in launcher.init_run_dir(args.run_dir).items()}, indent=2))
        elif args.command == "status":
            print(json.dumps(launcher.status(args.run_dir), indent=2))
    except RuntimeError as e:
        print(f"reference_stack {args.command}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
