"""The Prometheus rules and the sample scrape config: promtool accepts them, the rule
unit tests pass, every alert is covered by a test that needs it to fire, and every
alert carries a summary, a description with its value, and a runbook in docs/dashboards.md."""
import re
import subprocess

import pytest
import yaml

from tests.conftest import ROOT

RULES = ROOT / "dashboards" / "rules" / "slotune.rules.yml"
RULE_TESTS = ROOT / "dashboards" / "rules" / "slotune.rules.test.yml"
PROMTOOL = "/usr/bin/promtool"


def promtool(*args) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *map(str, args)], capture_output=True, text=True, timeout=60)


def rules() -> list[dict]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


ALERTS = [r["alert"] for r in rules() if "alert" in r]


def test_promtool_accepts_the_rules():
    out = promtool("check", "rules", RULES)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(rules())} rules found" in out.stdout


def test_rule_unit_tests_pass():
    out = promtool("test", "rules", RULE_TESTS)
    assert out.returncode == 0, out.stdout + out.stderr


def test_sample_prometheus_config_is_valid():
    out = promtool("check", "config", ROOT / "dashboards" / "prometheus.yml")
    assert out.returncode == 0, out.stdout + out.stderr


def never_fires(rule: dict) -> None:
    rule["expr"] = "vector(1) == 0"


def always_fires(rule: dict) -> None:
    """Every comparison with a threshold passes, at once: every series it sees alerts."""
    rule["expr"] = re.sub(r"\s(>|>=|==)\s[0-9.]+", " > -Inf", rule["expr"])
    rule.pop("for", None)


def checks_of(alert: str) -> dict:
    """The rule unit tests with only the groups that check this alert (each group costs promtool
    its whole evaluation span)."""
    doc = yaml.safe_load(RULE_TESTS.read_text())
    doc["tests"] = [t for t in doc["tests"] if any(a["alertname"] == alert for a in t.get("alert_rule_test", ()))]
    return doc


MUTANTS = [(alert, mutate) for alert in ALERTS for mutate in (never_fires, always_fires)]


@pytest.fixture(scope="module")
def mutant_runs(tmp_path_factory) -> dict[tuple[str, str], str]:
    """The rule unit tests against every copy of the rules where one alert's rule is mutated, in
    one promtool run (one run each cost a second apiece): (alert, mutation) -> what promtool said."""
    root = tmp_path_factory.mktemp("mutants")
    tests = {}
    for alert, mutate in MUTANTS:
        doc = yaml.safe_load(RULES.read_text())
        for group in doc["groups"]:
            for rule in group["rules"]:
                if rule.get("alert") == alert:
                    mutate(rule)
        folder = root / f"{alert}-{mutate.__name__}"
        folder.mkdir()
        (folder / RULES.name).write_text(yaml.safe_dump(doc))
        (folder / RULE_TESTS.name).write_text(yaml.safe_dump(checks_of(alert)))
        tests[(alert, mutate.__name__)] = folder / RULE_TESTS.name
    out = subprocess.run([PROMTOOL, "test", "rules", *map(str, tests.values())], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, timeout=120)
    said = dict(re.findall(r"^Unit Testing:\s+(\S+)\n(.*?)(?=^Unit Testing:|\Z)", out.stdout, re.M | re.S))
    return {key: said.get(str(path), f"promtool said nothing of {path}:\n{out.stdout[-2000:]}")
            for key, path in tests.items()}


@pytest.mark.parametrize("mutate", [never_fires, always_fires])
@pytest.mark.parametrize("alert", ALERTS)
def test_unit_tests_catch_an_alert_that_fires_wrongly(alert, mutate, mutant_runs):
    """A fires case must notice an alert that never fires; a stays-quiet case one that always does."""
    said = mutant_runs[(alert, mutate.__name__)]
    assert "FAILED" in said and f"alertname: {alert}," in said, said[-2000:]


@pytest.mark.parametrize("alert", ALERTS)
def test_alert_tells_what_and_how_much(alert):
    rule = next(r for r in rules() if r.get("alert") == alert)
    notes = rule["annotations"]
    assert notes["summary"] and "$labels.instance" in notes["summary"] + notes["description"]
    assert "$value" in notes["description"], "the description must show the value that fired"
    assert rule["labels"]["severity"] in ("page", "ticket")
    assert notes["runbook"].endswith(f"runbook: {alert}")


def test_every_alert_has_a_runbook_section_in_the_docs():
    page = (ROOT / "docs" / "dashboards.md").read_text()
    section = page.split("\n## Runbook", 1)[1].split("\n## ", 1)[0]
    for alert in ALERTS:
        assert re.search(rf"^### {alert}\b", section, re.M), f"docs/dashboards.md runbook has no '### {alert}'"


def test_burn_rate_alerts_use_the_workbook_windows():
    """1 h/5 m at 14.4, 6 h/30 m at 6, 1 d/2 h at 3 (Google SRE workbook, multiwindow multi-burn-rate)."""
    exprs = {r["alert"]: " ".join(r["expr"].split()) for r in rules() if r.get("alert", "").startswith("SlotuneSLOBurn")}
    want = {"SlotuneSLOBurnFast": ("1h", "5m", "14.4"), "SlotuneSLOBurnMedium": ("6h", "30m", "6"),
            "SlotuneSLOBurnSlow": ("1d", "2h", "3")}
    for alert, (long, short, factor) in want.items():
        assert exprs[alert] == (f"service:slotune_slo_burn_rate:ratio_rate{long} > {factor} "
                                f"and service:slotune_slo_burn_rate:ratio_rate{short} > {factor}")
    recorded = {r["record"]: " ".join(r["expr"].split()) for r in rules() if "record" in r}
    for window in ("5m", "30m", "1h", "2h", "6h", "1d"):
        assert recorded[f"service:slotune_slo_burn_rate:ratio_rate{window}"] == (
            f"sum by (instance, job, service) (rate(slotune_service_slo_misses_total[{window}])) "
            f"/ sum by (instance, job, service) (rate(slotune_service_requests_total[{window}])) / (1 - 0.99)")


def test_sample_alertmanager_config_is_valid():
    """dashboards/alertmanager.yml: amtool (Debian's prometheus-alertmanager ships it) accepts it,
    and it routes both severities the rules use to a receiver of their own."""
    out = subprocess.run(["amtool", "check-config", ROOT / "dashboards" / "alertmanager.yml"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "SUCCESS" in out.stdout, out.stdout + out.stderr
    doc = yaml.safe_load((ROOT / "dashboards" / "alertmanager.yml").read_text())
    routed = {r["matchers"][0]: r["receiver"] for r in doc["route"]["routes"]}
    assert set(routed) == {f'severity="{s}"' for r in rules() if "alert" in r for s in [r["labels"]["severity"]]}


def test_rule_files_path_in_sample_config_exists():
    config = yaml.safe_load((ROOT / "dashboards" / "prometheus.yml").read_text())
    for pattern in config["rule_files"]:
        assert (ROOT / "dashboards" / pattern).is_file(), pattern


def test_host_outlier_rule_computes_what_the_fleet_simulator_ranks(tmp_path):
    """The robust z of the slotune.fleet rules equals bench/sim/fleet_bench.host_outlier_z on the
    same P99s (seven hosts, one an outlier), so the simulator's table is the rule's."""
    import numpy as np
    from bench.sim import fleet_bench
    p99 = np.round(np.random.default_rng(7).lognormal(np.log(0.1), 0.08, 7) * [1, 1, 1, 1, 1, 1, 1.6], 4)
    z = fleet_bench.host_outlier_z(np.log(p99))
    series = [{"series": f'slotune_service_latency_seconds{{job="slotune",instance="gpu{i}:9477",service="inference",'
                         f'quantile="0.99"}}', "values": f"{v}x20"} for i, v in enumerate(p99)]
    samples = [{"labels": f'{{job="slotune",instance="gpu{i}:9477",service="inference"}}',
                "value": float(np.floor(v * 100 + 0.5) / 100)} for i, v in enumerate(z)]
    doc = {"rule_files": [str(RULES)], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series, "promql_expr_test": [{
            "expr": "round(service:slotune_host_outlier:robust_z, 0.01)", "eval_time": "15m",
            "exp_samples": samples}]}]}
    (tmp_path / "fleet.test.yml").write_text(yaml.safe_dump(doc))
    assert max(z) > fleet_bench.Z_ALERT > sorted(z)[-2]
    out = promtool("test", "rules", tmp_path / "fleet.test.yml")
    assert out.returncode == 0, out.stdout + out.stderr
