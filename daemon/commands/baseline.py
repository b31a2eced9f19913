"""`slotune baseline list|show|diff`: read the baseline store the daemon keeps:
which series it holds, one series' summary, and how two deploys compare."""
from __future__ import annotations

import argparse
import math
import sys
from datetime import datetime, timezone
from pathlib import Path

from daemon.store.baselines import BaselineStore, Summary, UnknownBaseline

NAME = "baseline"
HELP = "list the stored baselines, show one series' summary, or compare two deploys (KS test)"
EXAMPLES = """  slotune baseline list
  slotune baseline show gateway latency_p99_seconds --environment production --deploy v42
  slotune baseline diff gateway --from v41 --to v42
  slotune baseline list --store /var/lib/slotune/baselines.sqlite
"""
DEFAULT_STORE = "/var/lib/slotune/baselines.sqlite"
DEFAULT_CONFIG = "/etc/slotune/slotune.toml"
SIGNIFICANT_P = 0.01  # diff marks a metric whose points differ at this KS p-value


def add_arguments(parser) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--store", help=f"the baseline store file (default: the config's "
                                        f"daemon.baseline_store, else {DEFAULT_STORE})")
    common.add_argument("--config", help=f"take the store path and environment from this slotune.toml "
                                         f"(default: {DEFAULT_CONFIG} when it exists)")
    env = argparse.ArgumentParser(add_help=False)
    env.add_argument("--environment", help="the environment the points were recorded in "
                                           "(default: the config's daemon.environment, else production)")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    actions.add_parser("list", parents=[common], help="one line per stored series")
    show = actions.add_parser("show", parents=[common, env], help="summary of one service's metric")
    show.add_argument("service")
    show.add_argument("metric")
    show.add_argument("--deploy", help="only this deploy id (default: all deploys)")
    diff = actions.add_parser("diff", parents=[common, env], help="compare every metric of two deploys")
    diff.add_argument("service")
    diff.add_argument("--from", dest="deploy_a", required=True, metavar="DEPLOY_A")
    diff.add_argument("--to", dest="deploy_b", required=True, metavar="DEPLOY_B")
    diff.add_argument("--metric", action="append", dest="metrics", help="only this metric (repeatable)")


def store_and_environment(args) -> tuple[str, str]:
    """--store wins; else the config file's settings; else the defaults."""
    config_path = args.config or (DEFAULT_CONFIG if Path(DEFAULT_CONFIG).is_file() else None)
    store, environment = DEFAULT_STORE, "production"
    if config_path and not args.store:
        from daemon import config
        cfg = config.load(config_path)
        store, environment = cfg.baseline_store, cfg.environment
    return args.store or store, getattr(args, "environment", None) or environment


def when(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(c)) for c in column) for column in zip(header, *rows)]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(line, widths)).rstrip()
                     for line in [header, *rows])


def percent(change: float) -> str:
    return "-" if math.isnan(change) else f"{change:+.1%}"


def number(value: float | None) -> str:
    return "-" if value is None else f"{value:.6g}"


def list_series(store: BaselineStore, args, environment) -> int:
    rows = [[s.service, s.metric, s.environment, s.deploy_id, str(s.count), when(s.first_t), when(s.last_t)]
            for s in store.list()]
    if not rows:
        print(f"{store.path}: no baselines yet")
        return 0
    print(table(["SERVICE", "METRIC", "ENVIRONMENT", "DEPLOY", "POINTS", "FIRST (UTC)", "LAST (UTC)"], rows))
    return 0


def show(store: BaselineStore, args, environment) -> int:
    store.require(args.service, environment, args.metric, args.deploy)
    s: Summary = store.summary(args.service, args.metric, environment, args.deploy)
    print(f"{args.service} {args.metric}  environment {environment}, deploy {args.deploy or 'all'}")
    print(f"points  {s.count} from {when(s.first_t)} to {when(s.last_t)} UTC")
    for name in ("mean", "std", "p50", "p90", "p99"):
        print(f"{name:<7} {number(getattr(s, name))}")
    return 0


def diff(store: BaselineStore, args, environment) -> int:
    rows = store.diff(args.service, environment, args.deploy_a, args.deploy_b, args.metrics)
    print(f"{args.service} ({environment}): {args.deploy_a} -> {args.deploy_b}")
    lines = [[r.metric, number(r.a and r.a.mean), number(r.b and r.b.mean), percent(r.mean_change),
              number(r.a and r.a.p99), number(r.b and r.b.p99), percent(r.p99_change),
              "-" if math.isnan(r.ks_pvalue) else f"{r.ks_pvalue:.3g}",
              "yes" if r.ks_pvalue < SIGNIFICANT_P else "no"] for r in rows]
    print(table(["METRIC", "MEAN A", "MEAN B", "CHANGE", "P99 A", "P99 B", "CHANGE", "KS P",
                 f"DIFFERS (p<{SIGNIFICANT_P})"], lines))
    return 0


def run(args) -> int:
    try:
        path, environment = store_and_environment(args)
        with BaselineStore(path, create=False) as store:
            return {"list": list_series, "show": show, "diff": diff}[args.action](store, args, environment)
    except (OSError, UnknownBaseline, ValueError) as exc:
        print(f"slotune baseline: {exc}", file=sys.stderr)
        return 2
