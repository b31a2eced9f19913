"""`slotune baseline list|show|diff|import`: read the baseline store the daemon
keeps: which series it holds, one series' summary, how two deploys compare;
and fill it with a range of history from Prometheus, each deploy's points under
their deploy id."""
from __future__ import annotations

import argparse
import math
import re
import socket
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import NamedTuple

from slotune.store.baselines import BaselineStore, UnknownBaseline
from slotune.store.prometheus_history import (DEPLOY_INFO, STORE_METRICS, PrometheusError, PrometheusHistory,
                                             history_query, label_value)

NAME = "baseline"
HELP = ("list the stored baselines, show one series' summary, compare two deploys (KS test), "
        "or import history from Prometheus")
EXAMPLES = """  slotune baseline list
  slotune baseline show gateway latency_p99_seconds --environment production --deploy v42
  slotune baseline diff gateway --from v41 --to v42
  slotune baseline list --store /var/lib/slotune/baselines.sqlite
  slotune baseline import --from-prometheus http://prometheus:9090 --service gateway --metric latency_p99_seconds --since 7d
  slotune baseline import --since 7d                  # every configured service and metric, from daemon.prometheus_url
"""
DEFAULT_STORE = "/var/lib/slotune/baselines.sqlite"
DEFAULT_CONFIG = "/etc/slotune/slotune.toml"
SIGNIFICANT_P = 0.01  # diff marks a metric whose points differ at this KS p-value
UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


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
    imp = actions.add_parser("import", parents=[common, env],
                             help="copy a range of a host's history from Prometheus into the store")
    imp.add_argument("--from-prometheus", dest="prometheus", metavar="URL",
                     help="Prometheus' (or Thanos/Mimir's) query API (default: the config's daemon.prometheus_url)")
    imp.add_argument("--service", action="append", dest="services", metavar="SERVICE",
                     help="only this service (repeatable; default: every service of the config)")
    imp.add_argument("--metric", action="append", dest="metrics", metavar="METRIC",
                     help=f"only this metric (repeatable; default: {', '.join(STORE_METRICS)})")
    imp.add_argument("--since", default="7d", help="how far back, e.g. 12h, 7d, 2w (default: 7d)")
    imp.add_argument("--step", default="60s", help="one point per STEP, at least twice the scrape interval "
                                                  "(default: 60s)")
    imp.add_argument("--host", help=f"whose history: the host label of {DEPLOY_INFO} "
                                    f"(default: this host, {socket.gethostname()})")
    imp.add_argument("--histogram", help="take the metric from this histogram of the service's own "
                                         "(name without _bucket) instead of slotune's series")
    imp.add_argument("--quantile", type=float, help="--histogram's quantile (default: from the metric's name, "
                                                    "latency_p99_seconds -> 0.99)")


def load_config(args):
    """The config named by --config; else the default one when it exists and --store is not given."""
    path = args.config or (DEFAULT_CONFIG if Path(DEFAULT_CONFIG).is_file() and not args.store else None)
    if path is None:
        return None
    from slotune import config
    return config.load(path)


def store_and_environment(args, cfg) -> tuple[str, str]:
    """--store and --environment win; else the config file's settings; else the defaults."""
    store, environment = (cfg.baseline_store, cfg.environment) if cfg else (DEFAULT_STORE, "production")
    return args.store or store, getattr(args, "environment", None) or environment


def duration(text: str, flag: str) -> float:
    """90s, 30m, 12h, 7d, 2w (a bare number is seconds) -> seconds."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([smhdw]?)", text.strip())
    if not m or float(m[1]) <= 0:
        raise ValueError(f"{flag} {text!r} is not a duration; use e.g. 90s, 30m, 12h, 7d or 2w")
    return float(m[1]) * UNITS[m[2] or "s"]


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
    s = store.summary(args.service, args.metric, environment, args.deploy)
    assert s is not None, "require() found its points"
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


def quantile_of(args, metric: str) -> float:
    """--quantile, else the one the metric's name says (p99 -> 0.99, p999 -> 0.999)."""
    if args.quantile is not None:
        return args.quantile
    m = re.search(r"_p(\d+)_", metric)
    if not m:
        raise ValueError(f"--histogram {args.histogram}: which quantile is {metric}? pass --quantile")
    return int(m[1]) / 10 ** len(m[1])


class Plan(NamedTuple):
    """What an import reads: from which Prometheus, whose history, how far back, one point
    per step, and the query of each (service, metric)."""
    url: str
    host: str
    since: float
    step: float
    queries: dict[tuple[str, str], str]


def import_plan(args, cfg, environment) -> Plan:
    url = args.prometheus or (cfg.prometheus_url if cfg else "")
    if not url:
        raise ValueError("which Prometheus? pass --from-prometheus URL (or --config with daemon.prometheus_url)")
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"--from-prometheus {url!r} is not an http(s) URL; e.g. http://prometheus:9090")
    services = args.services or ([s.name for s in cfg.services] if cfg else [])
    if not services:
        raise ValueError("which services? pass --service NAME (repeatable), or --config to import every "
                         "service it declares")
    metrics = args.metrics or (["latency_p99_seconds"] if args.histogram else list(STORE_METRICS))
    if args.histogram and len(metrics) > 1:
        raise ValueError(f"--histogram {args.histogram} gives one metric; name it with one --metric")
    host, since, step = args.host or socket.gethostname(), duration(args.since, "--since"), duration(args.step, "--step")
    queries = {(s, m): history_query(m, s, host, environment, step, args.histogram or "",
                                     quantile_of(args, m) if args.histogram else 0.99) for s in services for m in metrics}
    return Plan(url, host, since, step, queries)


def import_history(store: BaselineStore, args, environment, plan: Plan) -> int:
    """Each (service, metric) in turn, a line as each lands; 1 when nothing was found at all."""
    history, end = PrometheusHistory(plan.url), time.time()
    start = end - plan.since
    services, metrics = {s: 0 for s, _ in plan.queries}, {m: 0 for _, m in plan.queries}
    print(f"importing the last {args.since} ({when(start)[:16]} .. {when(end)[:16]} UTC, one point per "
          f"{plan.step:g} s) of host {plan.host}, environment {environment}\n"
          f"  from Prometheus at {history.url} into {store.path}", flush=True)
    width_s, width_m = max(map(len, services)), max(map(len, metrics))
    began, total, empty = time.monotonic(), 0, []
    for (service, metric), query in plan.queries.items():
        try:
            stored = history.import_into(store, service, metric, query, start=start, end=end, step=plan.step,
                                         environment=environment)
        except PrometheusError as exc:
            kept = f" ({total:,} points imported before this stay in the store)" if total else ""
            raise PrometheusError(f"{exc}{kept}") from None
        n = sum(len(points) for points in stored.values())
        total += n
        line = f"{service:<{width_s}}  {metric:<{width_m}}  "
        if n:
            mean = sum(v for points in stored.values() for _, v in points) / n
            deploys = ", ".join(f"{d} ({len(p):,})" for d, p in sorted(stored.items(), key=lambda i: i[1][0][0]))
            print(f"{line}{n:>7,} points  mean {mean:.3g}  deploys {deploys}", flush=True)
        else:
            empty.append((service, metric))
            print(f"{line}   none", flush=True)
    print(f"imported {total:,} points ({len(services)} service(s) x {len(metrics)} metric(s)) "
          f"in {time.monotonic() - began:.1f} s")
    if empty:
        service, metric = empty[0]
        print(f"no points for {len(empty)} of {len(plan.queries)}, e.g. {service} {metric}: Prometheus at "
              f"{history.url} answered none to\n  {plan.queries[empty[0]]}\nFix: Prometheus must scrape the host's "
              f"daemon, so that {DEPLOY_INFO}{{host={label_value(plan.host)}, environment={label_value(environment)}}} "
              "exists there "
              "(else pass --host or --environment); the rates need a --step of at least twice the scrape interval",
              file=sys.stderr)
    return 0 if total else 1


def run(args) -> int:
    try:
        cfg = load_config(args)
        path, environment = store_and_environment(args, cfg)
        if args.action == "import":
            plan = import_plan(args, cfg, environment)
            with BaselineStore(path) as store:
                return import_history(store, args, environment, plan)
        with BaselineStore(path, create=False) as store:
            return {"list": list_series, "show": show, "diff": diff}[args.action](store, args, environment)
    except (OSError, UnknownBaseline, ValueError, PrometheusError) as exc:
        print(f"slotune baseline: {exc}", file=sys.stderr)
        return 2
