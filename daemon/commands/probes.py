"""`slotune probes`: list the kernel probe families, print the exact BPF program
slotune loads, or watch services live through the probes (a table per interval)."""
from __future__ import annotations

import signal
import sys
import textwrap
import time

from slotune.collectors.kernel.collector import KernelCollector
from slotune.collectors.kernel.families import FAMILIES, make_families
from slotune.collectors.kernel.program import program_text
from slotune.model.histogram import slot_bounds
from slotune.model.service import ServiceSpec

NAME = "probes"
HELP = "list the kernel probes, print the BPF program slotune loads, or watch services through it"
EXAMPLES = """  slotune probes --list                                each family: where it attaches, what it exports
  slotune probes --print                               the exact C text handed to BCC
  slotune probes --print --family tcp                  only one probe family
  slotune probes --watch --service web='http.server' --service db=redis-server
  slotune probes --watch --service api=port:8000 --interval 2 --count 5
"""


def add_arguments(parser) -> None:
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--list", action="store_true", help="list the probe families and their metrics, and exit")
    mode.add_argument("--print", action="store_true", help="print the program text and exit")
    mode.add_argument("--watch", action="store_true", help="load the probes and print per-service figures")
    parser.add_argument("--family", action="append", metavar="NAME",
                        help=f"probe family to include (repeatable): {', '.join(FAMILIES)}; default all")
    parser.add_argument("--service", action="append", default=[], metavar="NAME=MATCH",
                        help="a service to watch: NAME=REGEX over the command line, NAME=port:N, "
                             "NAME=unit:UNIT or NAME=cgroup:PATH (repeatable)")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between tables (default 1)")
    parser.add_argument("--count", type=int, default=0, help="stop after this many tables (default: until Ctrl-C)")


def parse_service(text: str) -> ServiceSpec:
    name, sep, match = text.partition("=")
    if not sep or not name or not match:
        raise SystemExit(f"--service {text!r}: expected NAME=MATCH, e.g. web='http.server' or api=port:8000")
    kind, colon, value = match.partition(":")
    if colon and kind == "port":
        if not value.isdigit():
            raise SystemExit(f"--service {text!r}: port must be a number, e.g. api=port:8000")
        return ServiceSpec(name, port=int(value))
    if colon and kind == "unit":
        return ServiceSpec(name, systemd_unit=value)
    if colon and kind == "cgroup":
        return ServiceSpec(name, cgroup=value)
    return ServiceSpec(name, cmdline=match)


def listing(families) -> str:
    """Each family: its C file, where it attaches, and the metrics it exports."""
    lines = []
    for family in families:
        lines.append(f"{family.name}  (bpf/{family.source}.bpf.c)")
        lines += textwrap.wrap(f"attaches to {', '.join(family.attach_points())}", 100,
                               initial_indent="  ", subsequent_indent="    ")
        for s in family.signals:
            labels = ",".join(["service"] + ([s.label] if s.label else []))
            lines.append(f"  {s.metric}{{{labels}}}  {s.kind}: {s.help}")
    return "\n".join(lines)


def table(samples) -> str:
    """One line per histogram (count, p50, p99, and max: the high edge of the
    highest bucket filled) and per counter."""
    lines = [f"{'service':<14} {'signal':<16} {'label':<10} {'count':>8} {'p50':>10} {'p99':>10} {'max':>10}"]
    for s in samples:
        for (sig, label), h in sorted(s.histograms.items()):
            top = slot_bounds(h.hi - 1)[1] / 1e9
            lines.append(f"{s.service:<14} {sig:<16} {label:<10} {h.count:>8} "
                         f"{fmt(h.quantile(0.5)):>10} {fmt(h.quantile(0.99)):>10} {fmt(top):>10}")
        for (sig, label), v in sorted(s.counters.items()):
            lines.append(f"{s.service:<14} {sig:<16} {label:<10} {v:>8.0f}")
        if not s.histograms and not s.counters:
            lines.append(f"{s.service:<14} (nothing this interval; {s.gauges.get(('processes', ''), 0):.0f} processes)")
    return "\n".join(lines)


def attach_report(attached: dict[str, bool]) -> str:
    """What attached and what did not, said once when the probes are loaded."""
    lines = []
    for ok, title in ((True, "attached"), (False, "not attached")):
        probes = [p for p, state in attached.items() if state is ok]
        if probes:
            lines += textwrap.wrap(f"{title} ({len(probes)}): {', '.join(probes)}", 100, subsequent_indent="    ")
    return "\n".join(lines) or "attached: nothing"


def fmt(seconds: float) -> str:
    if seconds != seconds:
        return "-"
    for unit, scale in (("s", 1), ("ms", 1e-3), ("µs", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g}{unit}"
    return f"{seconds * 1e9:.0f}ns"


def run(args) -> int:
    try:
        families = make_families(args.family)
    except ValueError as exc:
        raise SystemExit(f"--family: {exc}") from None
    if args.list:
        print(listing(families))
        return 0
    if args.print:
        print(program_text(families))
        return 0
    if not args.service:
        raise SystemExit("--watch needs at least one --service NAME=MATCH")
    services = [parse_service(s) for s in args.service]
    collector = KernelCollector(args.family)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))   # detach through close() below
    collector.start(services)
    if not collector.up:
        print(f"kernel probes could not load: {collector.start_error}\nrun `slotune doctor` for the fix")
        return 1
    print(attach_report(collector.attached), flush=True)
    try:
        shown, last = 0, time.time()
        while not args.count or shown < args.count:
            time.sleep(args.interval)
            now = time.time()
            print(time.strftime("%H:%M:%S") + "\n" + table(collector.collect(last, now)) + "\n", flush=True)
            last, shown = now, shown + 1
    except KeyboardInterrupt:
        pass
    finally:
        collector.close()
    return 0
