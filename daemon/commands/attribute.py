"""`slotune attribute SERVICE`: the running daemon's explanation of one
service's tail: the verdict and path, then each cause's share, what it rose
from and to, and its share of the jitter."""
from __future__ import annotations

import json
import sys

from slotune.commands.status import fetch

NAME = "attribute"
HELP = "explain what made a service's latency grow, and its jitter, by cause (share, evidence, the path through downstream services)"
EXAMPLES = """  slotune attribute gateway
  slotune attribute inference --url http://127.0.0.1:9477
  slotune attribute gateway --json          # the daemon's attribution record as JSON
"""


def add_arguments(parser) -> None:
    parser.add_argument("service", help="a service name from the daemon's config")
    parser.add_argument("--url", default="http://127.0.0.1:9477", help="the daemon's exporter address")
    parser.add_argument("--json", action="store_true", help="print the attribution record as JSON")


def _value(v: float, unit: str) -> str:
    return f"{v * 1e3:.2f} ms" if unit == "s" else f"{v:.3g}"


def render(service: str, a: dict) -> str:
    rows = [a["verdict"], f"confidence {a['confidence']:.0%}"]
    if not a.get("shares") and a.get("usual_tail_s"):
        rows[-1] += f"; its usual tail (P99 - P50 of the baseline) is {a['usual_tail_s'] * 1e3:.1f} ms"
    if a.get("excess_s") is not None and a.get("shares"):
        rows[-1] += (f"; {a.get('moved', 'P99')} grew {a.get('growth_s', 0) * 1e3:+.1f} ms over the baseline "
                     f"(shares are of this); P99 excess over P50 {a['excess_s'] * 1e3:.1f} ms; "
                     f"jitter (std of P99 across windows) {a.get('jitter_s', 0) * 1e3:.1f} ms")
    evidence = a.get("evidence", {})
    ranked = sorted(a.get("shares", {}).items(), key=lambda kv: -kv[1])
    if ranked:
        rows += ["", f"{'cause':<24} {'share':>6} {'jitter':>7}  {'baseline':>11} {'recent':>11}  signal"]
        for cause, share in ranked:
            e = evidence.get(cause, {})
            unit = e.get("unit", "s")
            rows.append(f"{cause:<24} {share:>6.0%} {a.get('jitter_shares', {}).get(cause, 0.0):>7.0%}  "
                        f"{_value(e.get('baseline', 0.0), unit):>11} {_value(e.get('recent', 0.0), unit):>11}  "
                        f"{e.get('signal', '')}")
        rest = max(1.0 - sum(s for _, s in ranked), 0.0)
        rows.append(f"{'rest (noise, unexplained)':<24} {rest:>6.0%}")
    if a.get("path"):
        rows += ["", "path: " + " → ".join(f"{svc}: {cause} {share:.0%}" for svc, cause, share in a["path"])]
    return "\n".join(rows)


def run(args) -> int:
    try:
        status = fetch(args.url)
    except OSError as exc:
        print(f"slotune attribute: no daemon answers at {args.url} ({exc}); is `slotune run` up?", file=sys.stderr)
        return 1
    services = status.get("services", {})
    if args.service not in services:
        known = ", ".join(services) or "none"
        print(f"slotune attribute: no service {args.service!r} in the daemon's config; configured: {known}",
              file=sys.stderr)
        return 2
    record = services[args.service].get("attribution")
    if not record:
        print(f"slotune attribute: {args.service}: no attribution yet (the daemon has just started)", file=sys.stderr)
        return 1
    print(json.dumps(record, indent=2) if args.json else render(args.service, record))
    return 0
