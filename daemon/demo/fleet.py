"""`slotune demo --fleet N`: N hosts on this machine (fleet_hosts.py: a network namespace each,
with its own reference stack and daemon, one Prometheus over them all), then one host's inference
server throttled to a sliver of a CPU; prints the fleet table, a row per host, worst first, until
that host's SlotuneHostOutlier fires, and the alert itself."""
from __future__ import annotations

import time
from pathlib import Path

from slotune.demo import fleet_hosts as fleet

FOR = "20s"          # the shipped rule waits 10 minutes; the demo's copy 20 s, nothing else differs


def run(run_dir: Path, hosts: int, show_every_s: float = 5.0, timeout_s: float = 180.0) -> int:
    if hosts < 3:
        raise RuntimeError(f"--fleet {hosts}: the fleet's median and spread need at least 3 hosts")
    run_dir.mkdir(parents=True, exist_ok=True)
    rules = fleet.rules_with_for(fleet.RULES, run_dir / "rules.yml", "SlotuneHostOutlier", FOR)
    print(f"starting {hosts} hosts (network namespaces, a stack and a daemon each) and Prometheus ...", flush=True)
    with fleet.Fleet(hosts, run_dir, rules=rules) as f:
        slow = f.hosts[len(f.hosts) // 2].name
        print(f"fleet up: Prometheus {f.prometheus_url}; logs in {run_dir}\n"
              f"throttling {slow}'s inference server to 2 % of a CPU (SlotuneHostOutlier holds {FOR} here, "
              f"10 m in production)", flush=True)
        f.slow_down(slow)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            time.sleep(show_every_s)
            print()
            fleet.print_rows(f)
            fired = [a for a in f.alerts() if a["state"] == "firing"]
            if fired:
                print()
                for a in fired:
                    print(f"ALERT SlotuneHostOutlier {a['labels']['instance']}/{a['labels']['service']}: "
                          f"{a['annotations']['summary']}\n  {a['annotations']['description']}")
                return 0
        print(f"\nno SlotuneHostOutlier fired in {timeout_s:.0f} s; logs are in {run_dir}")
        return 1
