"""`slotune demo`: the reference stack + the daemon + a load step, ending with
an HTML report (what `make demo` runs)."""
from __future__ import annotations

import sys
from pathlib import Path

NAME = "demo"
HELP = "run the reference stack and the daemon through a load step past capacity and back; write a report"
EXAMPLES = """  slotune demo                                 # about 3.5 minutes; prints the report's path
  slotune demo --capacity 20 --run-dir /tmp/demo
  slotune demo --dry-run                       # the same, but the daemon pushes nothing
  slotune demo --llm                           # LLM mode: a streaming load step, TTFT/TPOT SLOs (about 2.5 min)
  slotune demo --fleet 3                       # 3 hosts in namespaces, one slowed: SlotuneHostOutlier
  slotune demo --engine vllm                   # a real vLLM behind HAProxy, throttled (about 3 min; make engine)
"""


def add_arguments(parser) -> None:
    parser.add_argument("--run-dir", type=Path, default=None,
                        help="where the stack, the daemon's files and the report go (default: /tmp/slotune-demo, "
                             "/tmp/slotune-demo-llm with --llm, /tmp/slotune-demo-fleet with --fleet, /tmp/slotune-demo-engine "
                             "with --engine: each part "
                             "of `make demo` keeps its own report)")
    parser.add_argument("--capacity", type=float, default=None,
                        help="the stack's capacity in queries/s; the load steps to 1.5x it "
                             "(default: measured at the start, 10 s of closed-loop clients)")
    parser.add_argument("--scale", type=float, default=1.0, help="stretch (>1) or shrink (<1) every load phase")
    parser.add_argument("--dry-run", action="store_true", help="the daemon decides and reports but pushes nothing")
    parser.add_argument("--llm", action="store_true",
                        help="the inference server in LLM mode: streaming completions step from the calm rate "
                             "(--capacity, default 1 request/s) to 3x and back, judged on TTFT and TPOT SLOs, "
                             "with the continuous_batch tuner (docs/llm_serving.md)")
    parser.add_argument("--fleet", type=int, metavar="N",
                        help="instead: N hosts (3 or more) as network namespaces with a stack and a daemon each, "
                             "one Prometheus; one host is slowed and raises SlotuneHostOutlier (docs/fleet.md)")
    parser.add_argument("--engine", choices=("vllm",),
                        help="instead: a real vLLM (CPU build, tiny model: `make engine` installs both) behind "
                             "HAProxy, slotune throttling HAProxy's maxconn to hold vLLM's TTFT through a step to "
                             "2x its measured capacity and back (docs/engines.md)")


def default_run_dir(args) -> Path:
    """Each kind of demo its own folder: `make demo`'s two parts keep their own reports."""
    kind = "-fleet" if args.fleet is not None else "-engine" if args.engine else "-llm" if args.llm else ""
    return Path("/tmp/slotune-demo" + kind)


def the_stack_from_the_checkout() -> bool:
    """The demo and the reference stack it starts run from a checkout (daemon/demo and
    reference_stack/ are not installed): put the checkout on the path, or say so."""
    checkout = Path(__file__).resolve().parents[2]        # daemon/commands/demo.py -> the checkout
    if (checkout / "daemon" / "demo").is_dir() and (checkout / "reference_stack" / "__init__.py").is_file():
        if str(checkout) not in sys.path:
            sys.path.insert(0, str(checkout))
        return True
    print("slotune demo: runs from a checkout of slotune (the demo and its reference stack are not "
          "installed): git clone the project, then `make demo` there", file=sys.stderr)
    return False


def run(args) -> int:
    args.run_dir = args.run_dir or default_run_dir(args)
    if not the_stack_from_the_checkout():
        return 2
    if (args.capacity is not None and args.capacity <= 0) or args.scale <= 0:
        print("slotune demo: --capacity and --scale must be > 0", file=sys.stderr)
        return 2
    if args.fleet is not None:
        from slotune.demo import fleet
        try:
            return fleet.run(args.run_dir, args.fleet)
        except (RuntimeError, ValueError) as exc:
            print(f"slotune demo --fleet: {exc}", file=sys.stderr)
            return 1
    if args.engine is not None:
        from slotune.demo import engine
        try:
            path = engine.run(args.run_dir, args.scale, args.dry_run)
        except RuntimeError as exc:
            print(f"slotune demo --engine {args.engine}: {exc}", file=sys.stderr)
            return 1
        print(f"\nreport: {path}")
        return 0
    from slotune.demo import run as demo
    try:
        path = demo.run(args.run_dir, args.capacity, args.scale, args.dry_run, llm=args.llm)
    except RuntimeError as exc:
        print(f"slotune demo: {exc}", file=sys.stderr)
        return 1
    print(f"\nreport: {path}")
    return 0
