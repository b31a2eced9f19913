"""A fleet of three hosts on this machine (daemon/demo/fleet_hosts.py: network namespaces, each with its own
reference stack and slotune daemon, one real Prometheus scraping them by instance with the
shipped rules): the host whose inference server is CPU-throttled raises SlotuneHostOutlier, the
other two never do, and the fleet dashboard's table lists one row per host, the slow one first."""
from __future__ import annotations

import time

import pytest
import yaml

from slotune.demo import fleet_hosts as fleet
from bench.sim import fleet_bench

FOR = "10s"      # the shipped rule holds for 10m; nothing else in the test copy differs


@pytest.fixture
def test_rules(tmp_path):
    path = fleet.rules_with_for(fleet.RULES, tmp_path / "rules.yml", "SlotuneHostOutlier", FOR)
    shipped, copy = yaml.safe_load(fleet.RULES.read_text()), yaml.safe_load(path.read_text())
    for group in copy["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == "SlotuneHostOutlier":
                assert rule["for"] == FOR
                rule["for"] = "10m"
    assert copy == shipped, "the test copy of the rules differs from the shipped ones beyond `for:`"
    return path


def outlier_hosts(f: fleet.Fleet, state: str) -> set[str]:
    return {a["labels"]["instance"] for a in f.alerts() if a["state"] == state}


def test_the_throttled_host_alone_is_an_outlier(tmp_path, test_rules, root_only):
    with fleet.Fleet(3, tmp_path / "fleet", rules=test_rules) as f:
        up = {s["metric"]["instance"]: s["value"][1] for s in f.query('up{job="slotune"}')}
        assert up == {"host1": "1", "host2": "1", "host3": "1"}, up
        f.slow_down("host2")
        deadline = time.monotonic() + 90
        while "host2" not in outlier_hosts(f, "firing"):
            assert time.monotonic() < deadline, f"no SlotuneHostOutlier for host2 in 90 s; rows: {f.hosts_worst_first()}"
            time.sleep(2)
        for _ in range(5):          # and it stays so while the others are watched a while longer
            assert outlier_hosts(f, "firing") | outlier_hosts(f, "pending") == {"host2"}
            time.sleep(2)
        # Fired, over the whole run: only host2. A few seconds pending elsewhere is not an alert (the test's
        # `for:` is 10 s, and a clean-clone CI run on a loaded host once had host3 pending briefly)
        fired = 'max_over_time(ALERTS{alertname="SlotuneHostOutlier",alertstate="firing"}[10m])'
        ever = {s["metric"]["instance"] for s in f.query(fired)}
        assert ever == {"host2"}, f"SlotuneHostOutlier fired for {ever} during the run"
        pending = {s["metric"]["instance"] for s in f.query(fired.replace('"firing"', '"pending"'))} - {"host2"}
        print(f"pending at some point, never firing: {sorted(pending) or 'none'}")

        alert = next(a for a in f.alerts() if a["labels"]["instance"] == "host2")
        assert alert["labels"]["service"] == "inference" and alert["labels"]["severity"] == "ticket"
        assert "inference on host2 is slower than the fleet" in alert["annotations"]["summary"]
        assert "above the fleet median of" in alert["annotations"]["description"]

        rows = f.hosts_worst_first()
        assert [r["instance"] for r in rows][0] == "host2" and sorted(r["instance"] for r in rows) == \
            ["host1", "host2", "host3"], rows
        assert [r["robust z"] for r in rows] == sorted((r["robust z"] for r in rows), reverse=True)
        assert rows[0]["robust z"] > fleet_bench.Z_ALERT > max(r["robust z"] for r in rows[1:])
        # the fault was real: the kernel throttled host2's inference server, and it answers slower
        throttled = dict(line.split() for line in (f.host("host2").cgroup / "cpu.stat").read_text().splitlines())
        assert int(throttled["nr_throttled"]) > 0
        assert rows[0]["P99 (10 m)"] > 2 * max(r["P99 (10 m)"] for r in rows[1:])
    assert not any(h.cgroup for h in f.hosts)


def test_a_fleet_demo_of_fewer_than_three_hosts_is_refused(tmp_path):
    from tests.conftest import run_slotune
    out = run_slotune("demo", "--fleet", "2", "--run-dir", str(tmp_path), timeout=60)
    assert out.returncode == 1 and "--fleet 2: the fleet's median and spread need at least 3 hosts" in out.stderr
    assert not list(tmp_path.iterdir()), "a refused demo must start nothing"
