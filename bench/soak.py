"""Soak: does the daemon stay flat and sane over an hour of real work? The
reference stack under a diurnal load (one period over the run), a real
`slotune run` tuning it (closed loop, the config of `slotune demo`), a SIGHUP to
the daemon every --hup-every-s and a restart of the gateway (its control API
goes away and comes back on a new pid) every --restart-every-s. The daemon's
RSS and open fds are sampled every --sample-every-s.

At the end it prints, and checks: RSS and open fds, first quarter vs last
quarter (medians; pass within 5 %), "Traceback" lines in the daemon's log
(must be 0), audit entries and how many parse as JSON (must be all),
decisions and rollbacks, SIGHUPs sent and reloads logged (must be equal), and
the daemon's exit status on SIGTERM (must be 0). Exit 1 when a check fails.

The quarters are taken over the samples after the daemon's window history
(daemon.process.HISTORY_S, 600 s) has filled, or after the first quarter of the
run when that is shorter: while it fills, RSS grows by design (docs/daemon.md,
Footprint), which is not a leak.

    python -m bench.soak                                   # one hour
    python -m bench.soak --minutes 4 --hup-every-s 30 --restart-every-s 60   # a quick check"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import psutil

from slotune.store.audit import Outcome
from slotune.demo.run import GATEWAY_SLO_MS, INFERENCE_SLO_MS, measure_capacity, start_daemon
from slotune.demo.stack_config import for_reference_stack
from slotune.process import HISTORY_S
from reference_stack import launcher, loadgen

TOLERANCE = 0.05          # RSS and fds: last quarter within 5 % of the first
W = 36                    # width of the report's first column
RELOADED = "config reloaded from"
REFUSED = "config reload refused"
DECISIONS = {Outcome.PUSHED, Outcome.DRY_RUN, Outcome.HELD, Outcome.REFUSED, Outcome.PUSH_FAILED}


@dataclass
class Sample:
    t: float              # seconds since the load began
    rss_mib: float        # VmRSS
    hwm_mib: float        # VmHWM: the peak RSS so far
    fds: int              # entries in /proc/<pid>/fd
    threads: int


def sample(pid: int, t: float) -> Sample:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.split()
    return Sample(t, int(fields["VmRSS"][0]) / 1024, int(fields["VmHWM"][0]) / 1024,
                  len(os.listdir(f"/proc/{pid}/fd")), int(fields["Threads"][0]))


def audit_figures(path: Path) -> tuple[int, int, Counter]:
    """(entries, entries that parse as JSON, their outcomes) of the audit log."""
    lines = [line for line in path.read_text().splitlines() if line] if path.exists() else []
    parsed, outcomes = 0, Counter()
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        parsed += 1
        outcomes[entry.get("outcome", "")] += 1
    return len(lines), parsed, outcomes


def quarters(samples: list[Sample], steady_from: float, value) -> tuple[float, float]:
    """Medians of `value` over the first and the last quarter of the samples taken from steady_from on."""
    steady = [s for s in samples if s.t >= steady_from] or samples
    q = max(1, len(steady) // 4)
    return statistics.median(value(s) for s in steady[:q]), statistics.median(value(s) for s in steady[-q:])


def run_soak(args, work: Path) -> int:
    duration = args.minutes * 60.0
    cfg = launcher.StackConfig.on_free_ports(work / "stack")
    print(f"==> starting the reference stack in {cfg.run_dir}", flush=True)
    state = launcher.start(cfg)
    daemon = None
    try:
        rate = args.rate
        if not rate:
            capacity = measure_capacity(state["query_url"])
            rate = args.load_factor * capacity
            print(f"    capacity {capacity:.1f} q/s (closed loop); mean offered rate {args.load_factor:g} x that "
                  f"= {rate:.1f} q/s", flush=True)
        port = launcher.free_ports(1)[0]
        config_path = work / "slotune.toml"
        config_path.write_text(for_reference_stack(state, port, work, gateway_slo_ms=GATEWAY_SLO_MS,
                                                   inference_slo_ms=INFERENCE_SLO_MS, environment="soak"))
        print(f"==> starting slotune run (closed loop), config {config_path}", flush=True)
        daemon = start_daemon(config_path, work, f"http://127.0.0.1:{port}", dry_run=False)
        log_path = work / "daemon.log"
        print(f"==> {args.minutes:g} min of diurnal load, {0.2 * rate:.1f}..{1.8 * rate:.1f} q/s (mean {rate:.1f}); "
              f"SIGHUP every {args.hup_every_s:g} s, gateway restart every {args.restart_every_s:g} s, "
              f"RSS/fds every {args.sample_every_s:g} s", flush=True)
        print(f"{'elapsed':>7}  {'offered q/s':>11}  {'RSS MiB':>7}  {'fds':>4}  {'threads':>7}  {'HUPs':>4}  "
              f"{'reloads':>7}  {'restarts':>8}  {'audit':>6}  {'Tracebacks':>10}", flush=True)
        records: list = []
        loader = threading.Thread(target=lambda: records.extend(
            loadgen.run_load(state["query_url"], rate, duration, profile="diurnal", seed=args.seed)), daemon=True)
        t0 = time.monotonic()
        loader.start()
        samples: list[Sample] = []
        hups, restarts, downtimes = 0, 0, []
        next_sample, next_hup, next_restart, next_line = 0.0, args.hup_every_s, args.restart_every_s, 60.0
        while True:
            now = time.monotonic() - t0
            if daemon.poll() is not None:
                print(f"the daemon exited during the soak (status {daemon.returncode}) at {now:.0f} s; "
                      f"see {log_path}", flush=True)
                break
            if now >= duration:
                break
            if now >= next_sample:
                samples.append(sample(daemon.pid, now))
                next_sample += args.sample_every_s
            if args.hup_every_s and now >= next_hup:
                os.kill(daemon.pid, signal.SIGHUP)   # as ExecReload= does: the main pid only
                hups += 1
                next_hup += args.hup_every_s
            if args.restart_every_s and now >= next_restart:
                downtimes.append(launcher.restart(cfg, state, "gateway"))
                restarts += 1
                next_restart += args.restart_every_s
            if now >= next_line and samples:
                text = log_path.read_text(errors="replace")
                last = samples[-1]
                offered = float(loadgen.rate_at("diurnal", rate, np.array([now]), duration)[0])
                print(f"{now / 60:>5.1f} m  {offered:>11.1f}  {last.rss_mib:>7.1f}  {last.fds:>4}  {last.threads:>7}  "
                      f"{hups:>4}  {text.count(RELOADED):>7}  {restarts:>8}  "
                      f"{audit_figures(work / 'audit.jsonl')[0]:>6}  "
                      f"{sum(line.startswith('Traceback') for line in text.splitlines()):>10}", flush=True)
                next_line += 60.0
            time.sleep(max(0.05, min(next_sample, next_line, next_hup if args.hup_every_s else duration,
                                     next_restart if args.restart_every_s else duration, duration)
                           - (time.monotonic() - t0)))
        ran_s = time.monotonic() - t0
        died = daemon.poll() is not None
        time.sleep(2.0)  # the last SIGHUP's reload gets logged
        exit_status = daemon.returncode if died else stop(daemon)
        loader.join(timeout=15)
        return report(args, work, samples, ran_s, duration, rate, hups, restarts, downtimes, records,
                      exit_status, died)
    finally:
        if daemon is not None and daemon.poll() is None:
            stop(daemon)
        launcher.stop(cfg.run_dir)


def stop(daemon: subprocess.Popen) -> int:
    """SIGTERM the daemon (its session, as `slotune demo` does); its exit status."""
    os.killpg(daemon.pid, signal.SIGTERM)
    try:
        return daemon.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(daemon.pid, signal.SIGKILL)
        daemon.wait()
        return -signal.SIGKILL


def report(args, work, samples, ran_s, duration, rate, hups, restarts, downtimes, records, exit_status,
           died) -> int:
    text = (work / "daemon.log").read_text(errors="replace")
    tracebacks = [i for i, line in enumerate(text.splitlines()) if line.startswith("Traceback")]
    entries, parsed, outcomes = audit_figures(work / "audit.jsonl")
    reloads, refused = text.count(RELOADED), text.count(REFUSED)
    steady_from = min(HISTORY_S, duration / 4)
    checks: list[tuple[str, bool]] = []
    print(f"\nslotune soak, {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {psutil.cpu_count()} CPUs: "
          f"{ran_s / 60:.1f} of {args.minutes:g} min, diurnal {0.2 * rate:.1f}..{1.8 * rate:.1f} q/s, "
          f"{len(samples)} samples every {args.sample_every_s:g} s")
    if len(samples) >= 2:
        print(f"quarters over the samples from {steady_from:.0f} s on (before, the daemon's {HISTORY_S:.0f} s "
              f"window history fills)\n")
        print(f"{'':<{W}} {'first quarter':>13} {'last quarter':>13} {'ratio':>7}  check")
        for name, value, fmt in (("daemon RSS, MiB (median)", lambda s: s.rss_mib, ".1f"),
                                 ("daemon open fds (median)", lambda s: s.fds, ".0f")):
            first, last = quarters(samples, steady_from, value)
            ratio = last / first if first else float("nan")
            ok = abs(ratio - 1) <= TOLERANCE
            checks.append((name, ok))
            print(f"{name:<{W}} {first:>13{fmt}} {last:>13{fmt}} {ratio:>7.3f}  "
                  f"{'pass' if ok else 'FAIL'} (within {TOLERANCE:.0%})")
    else:
        checks.append(("RSS and fds sampled", False))
        print("too few samples to compare quarters: FAIL")
    print()
    rows = [("Traceback lines in the daemon's log", f"{len(tracebacks)}", not tracebacks, "must be 0"),
            ("audit entries / parse as JSON", f"{entries} / {parsed}", parsed == entries, "must be all"),
            ("SIGHUPs sent / reloads logged", f"{hups} / {reloads}", reloads == hups and not refused,
             f"must be equal; {refused} refused"),
            ("daemon exit status on SIGTERM", "died" if died else f"{exit_status}", not died and exit_status == 0,
             "must be 0")]
    for name, value, ok, rule in rows:
        checks.append((name, ok))
        print(f"{name:<{W}} {value:>13}  {'pass' if ok else 'FAIL'} ({rule})")
    decided = sum(n for o, n in outcomes.items() if o in DECISIONS)
    kinds = ", ".join(f"{o} {n}" for o, n in outcomes.most_common() if o in DECISIONS)
    figures = [("decisions", f"{decided}", kinds),
               ("verdicts: kept / rolled back", f"{outcomes[Outcome.KEPT]} / {outcomes[Outcome.ROLLED_BACK]}",
                f"rollback failed {outcomes[Outcome.ROLLBACK_FAILED]}, alerts raised {outcomes[Outcome.ALERT_RAISED]}"),
               ("gateway restarts", f"{restarts}",
                f"answering again after {min(downtimes):.1f}..{max(downtimes):.1f} s" if downtimes else "")]
    if samples:
        figures += [("daemon peak RSS (VmHWM), MiB", f"{max(s.hwm_mib for s in samples):.1f}", ""),
                    ("daemon most fds / threads",
                     f"{max(s.fds for s in samples)} / {max(s.threads for s in samples)}", "")]
    if records:
        load = loadgen.summarize(records, duration)
        answered = sum(load["outcomes"].get(o, 0) for o in ("ok", "degraded"))
        outcomes_seen = ", ".join(f"{o} {n}" for o, n in sorted(load["outcomes"].items()))
        figures.append(("queries sent / answered", f"{len(records)} / {answered}",
                        f"P99 {load['p99_s'] * 1e3:.0f} ms; {outcomes_seen}"))
    for name, value, note in figures:
        print(f"{name:<{W}} {value:>13}  {note}".rstrip())
    if tracebacks:
        lines = text.splitlines()
        print(f"\nfirst traceback (line {tracebacks[0] + 1} of {work / 'daemon.log'}):\n  "
              + "\n  ".join(lines[tracebacks[0]:tracebacks[0] + 12]))
    failed = [name for name, ok in checks if not ok]
    print(f"\n{'FAIL: ' + ', '.join(failed) if failed else 'all checks pass'}; daemon log {work / 'daemon.log'}, "
          f"audit log {work / 'audit.jsonl'}", flush=True)
    return 1 if failed else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=60.0, help="how long (default: %(default)g)")
    ap.add_argument("--hup-every-s", type=float, default=300.0, help="SIGHUP the daemon this often (0: never)")
    ap.add_argument("--restart-every-s", type=float, default=600.0, help="restart the gateway this often (0: never)")
    ap.add_argument("--sample-every-s", type=float, default=10.0, help="read the daemon's RSS and fds this often")
    ap.add_argument("--rate", type=float, default=0.0,
                    help="mean offered q/s (default: --load-factor x the capacity measured first)")
    ap.add_argument("--load-factor", type=float, default=0.6,
                    help="mean rate / capacity; the diurnal peak is 1.8x the mean (default: %(default)g)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    if args.minutes <= 0 or args.sample_every_s <= 0 or args.hup_every_s < 0 or args.restart_every_s < 0:
        ap.error("--minutes and --sample-every-s must be positive, the intervals >= 0")
    work = Path(tempfile.mkdtemp(prefix="slotune-soak-"))
    return run_soak(args, work)


if __name__ == "__main__":
    sys.exit(main())
