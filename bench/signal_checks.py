"""How each signal was checked: runs the probe tests that compare a signal with a
reference nobody on the team wrote (nstat, ss, bpftrace, openssl s_time, nginx's
access log, the Go server's own count, a client's own clock; tests/probes/agreement.py)
and prints one row per comparison: slotune's figure, the reference's, the
difference and what the test asserts. The README's table comes from this.

    python -m bench.signal_checks               # each test once, about 3 minutes
    python -m bench.signal_checks --runs 3      # the range over 3 runs

Needs root (eBPF, network namespaces)."""
from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.probes.agreement import FILE_VARIABLE  # noqa: E402

TESTS = ["tests/probes/test_http.py", "tests/probes/test_http_streaming.py", "tests/probes/test_tcp.py",
         "tests/probes/test_tcp_netns.py", "tests/probes/test_tls.py", "tests/probes/test_tls_records.py",
         "tests/probes/test_runqueue.py", "tests/probes/test_runqueue_bpftrace.py", "tests/probes/test_exec.py"]


def difference(ours: float, theirs: float) -> str:
    if ours == theirs:
        return "0"
    return f"{(ours - theirs) / theirs:+.1%}" if theirs else f"{ours - theirs:+g}"


def figure(v: float) -> str:
    return f"{v:.0f}" if v == int(v) or abs(v) >= 100 else f"{v:.3g}"


def table(rows: list[dict]) -> str:
    """One line per (signal, reference): the figures of the last run, the range of the
    difference over every run."""
    by = collections.OrderedDict()
    for r in rows:
        by.setdefault((r["signal"], r["reference"]), []).append(r)
    head = ("signal", "independent reference", "slotune", "reference", "difference", "asserted")
    lines = []
    for (signal, reference), rs in by.items():
        diffs = sorted(((r["slotune"] - r["theirs"]) / r["theirs"] if r["theirs"] else 0.0) for r in rs)
        last = rs[-1]
        spread = difference(last["slotune"], last["theirs"]) if len(rs) == 1 else (
            "0" if diffs[0] == diffs[-1] == 0 else f"{diffs[0]:+.1%} .. {diffs[-1]:+.1%} ({len(rs)})")
        unit = f" {last['unit']}" if last["unit"] else ""
        lines.append((signal, reference, figure(last["slotune"]) + unit, figure(last["theirs"]) + unit, spread,
                      last["bound"]))
    widths = [max(len(str(x[i])) for x in [head, *lines]) for i in range(len(head))]
    out = ["| " + " | ".join(h.ljust(w) for h, w in zip(head, widths)) + " |",
           "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += ["| " + " | ".join(str(c).ljust(w) for c, w in zip(line, widths)) + " |" for line in lines]
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=1, help="runs of each test (default 1)")
    ap.add_argument("--json", type=Path, help="also write every comparison here")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("signal_checks: needs root (eBPF probes, network namespaces)", file=sys.stderr)
        return 2
    tests = [t for t in TESTS if (ROOT / t).exists()]
    with tempfile.NamedTemporaryFile(prefix="slotune-agreement-", suffix=".jsonl") as f:
        t0, failed = time.time(), []
        for run in range(args.runs):
            for i, test in enumerate(tests, 1):
                print(f"run {run + 1}/{args.runs}, {i}/{len(tests)}: {test}", file=sys.stderr, flush=True)
                done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
                                      cwd=ROOT, env=dict(os.environ, **{FILE_VARIABLE: f.name}),
                                      capture_output=True, text=True)
                if done.returncode:
                    failed.append(f"{test} (run {run + 1})")
        rows = [json.loads(line) for line in Path(f.name).read_text().splitlines()]
    print(table(rows))
    print(f"\n{len(rows)} comparisons from {len(tests)} test files x {args.runs} run(s) in {time.time() - t0:.0f} s, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    if failed:
        print("tests that failed (their rows are in the table as measured): " + ", ".join(failed))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
