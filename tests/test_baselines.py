"""The baseline store: summaries and diffs users read, and a file that survives kill -9 of its writer."""
import math
import re
import signal
import sqlite3
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from slotune.store.baselines import BaselineStore, UnknownBaseline
from tests.conftest import ROOT, run_slotune


@pytest.fixture
def store(tmp_path):
    with BaselineStore(tmp_path / "state" / "baselines.sqlite") as s:
        yield s


def test_summary_matches_the_points_recorded(store):
    values = np.linspace(0.1, 1.0, 100)
    store.record_many(("gw", "p99_seconds", v, 1000.0 + i, "prod", "d1") for i, v in enumerate(values))
    s = store.summary("gw", "p99_seconds", "prod")
    assert s.count == 100
    assert s.mean == pytest.approx(values.mean())
    assert s.std == pytest.approx(values.std(ddof=1))
    assert (s.p50, s.p90, s.p99) == pytest.approx(tuple(np.quantile(values, [0.5, 0.9, 0.99])))
    assert (s.first_t, s.last_t) == (1000.0, 1099.0)
    np.testing.assert_allclose(store.values("gw", "p99_seconds", "prod", since=1090, until=1094), values[90:95])
    assert store.summary("gw", "p99_seconds", "staging") is None
    assert store.summary("gw", "p50_seconds", "prod") is None


def test_series_are_kept_apart_by_environment_and_deploy(store):
    store.record("gw", "p99_seconds", 1.0, 10.0, "prod", "d1")
    store.record("gw", "p99_seconds", 2.0, 20.0, "prod", "d2")
    store.record("gw", "p99_seconds", 9.0, 20.0, "staging", "d2")
    store.record("gw", "error_ratio", 0.01, 21.0, "prod", "d2")
    assert store.summary("gw", "p99_seconds", "prod", deploy_id="d1").mean == 1.0
    assert store.summary("gw", "p99_seconds", "prod").mean == 1.5  # all deploys
    assert [(d.deploy_id, d.first_t, d.last_t, d.count) for d in store.deploys("gw", "prod")] == \
        [("d1", 10.0, 10.0, 1), ("d2", 20.0, 21.0, 2)]
    assert [tuple(row) for row in store.list()] == [
        ("gw", "p99_seconds", "prod", "d1", 1, 10.0, 10.0),
        ("gw", "p99_seconds", "prod", "d2", 1, 20.0, 20.0),
        ("gw", "error_ratio", "prod", "d2", 1, 21.0, 21.0),
        ("gw", "p99_seconds", "staging", "d2", 1, 20.0, 20.0)]


def test_recording_a_window_twice_keeps_one_point(store):
    store.record("gw", "p99_seconds", 1.0, 10.0, "prod", "d1")
    store.record("gw", "p99_seconds", 3.0, 10.0, "prod", "d1")
    assert store.values("gw", "p99_seconds", "prod").tolist() == [3.0]


def test_diff_reports_a_regression_and_no_change(store):
    rng = np.random.default_rng(7)
    before, after = rng.normal(0.200, 0.01, 500), rng.normal(0.220, 0.01, 500)
    errors = rng.normal(0.01, 0.001, 1000)
    store.record_many(("gw", "p99_seconds", v, i, "prod", "v1") for i, v in enumerate(before))
    store.record_many(("gw", "p99_seconds", v, 1000 + i, "prod", "v2") for i, v in enumerate(after))
    store.record_many(("gw", "error_ratio", v, i, "prod", "v1" if i < 500 else "v2") for i, v in enumerate(errors))
    rows = {row.metric: row for row in store.diff("gw", "prod", "v1", "v2")}
    assert set(rows) == {"p99_seconds", "error_ratio"}
    latency = rows["p99_seconds"]
    assert latency.mean_change == pytest.approx(0.10, abs=0.01)
    assert latency.a.count == latency.b.count == 500
    assert latency.ks_pvalue < 1e-6 and latency.ks_statistic > 0.5
    assert abs(rows["error_ratio"].mean_change) < 0.01 and rows["error_ratio"].ks_pvalue > 0.01


def test_diff_names_unknown_deploys_and_services(store):
    store.record("gw", "p99_seconds", 1.0, 10.0, "prod", "v1")
    with pytest.raises(UnknownBaseline, match=r"no deploy 'v9'.*known deploys: v1"):
        store.diff("gw", "prod", "v1", "v9")
    with pytest.raises(UnknownBaseline, match=r"service 'inference'.*known services.*gw \(prod\)"):
        store.diff("inference", "prod", "v1", "v2")


def test_diff_of_a_metric_only_one_deploy_has(store):
    store.record("gw", "p99_seconds", 1.0, 10.0, "prod", "v1")
    store.record("gw", "p99_seconds", 1.0, 20.0, "prod", "v2")
    store.record("gw", "queue_seconds", 1.0, 21.0, "prod", "v2")
    row = {r.metric: r for r in store.diff("gw", "prod", "v1", "v2")}["queue_seconds"]
    assert row.a is None and row.b.count == 1 and math.isnan(row.mean_change)


def test_prune_drops_old_points_and_empty_series(store):
    store.record_many(("gw", "p99_seconds", 1.0, float(t), "prod", "old" if t < 50 else "new") for t in range(100))
    assert store.prune(older_than=60.0) == 60
    assert [d.deploy_id for d in store.deploys("gw", "prod")] == ["new"]
    assert store.summary("gw", "p99_seconds", "prod").first_t == 60.0


def test_bad_rows_are_refused_whole_with_the_reason(store):
    with pytest.raises(ValueError, match="finite"):
        store.record_many([("gw", "p99_seconds", 1.0, 1.0, "prod", "d1"),
                           ("gw", "p99_seconds", float("nan"), 2.0, "prod", "d1")])
    with pytest.raises(ValueError, match="value and t must be finite numbers"):
        store.record("gw", "p99_seconds", "fast", 1.0, "prod", "d1")
    with pytest.raises(ValueError, match="deploy_id must be a non-empty string"):
        store.record("gw", "p99_seconds", 1.0, 1.0, "prod", "")
    assert store.list() == []


def test_unusable_paths_are_named(tmp_path):
    (tmp_path / "afile").write_text("")
    with pytest.raises(OSError, match=f"cannot open baseline store {tmp_path}/afile/b.sqlite"):
        BaselineStore(tmp_path / "afile" / "b.sqlite")
    with pytest.raises(OSError, match="cannot open baseline store /proc/slotune/b.sqlite"):
        BaselineStore("/proc/slotune/b.sqlite")  # procfs refuses new folders, even to root
    with pytest.raises(FileNotFoundError, match=f"baseline store {tmp_path}/missing.sqlite does not exist"):
        BaselineStore(tmp_path / "missing.sqlite", create=False)
    (tmp_path / "notes.txt").write_text("not a database")
    with pytest.raises(OSError, match=f"cannot open baseline store {tmp_path}/notes.txt: file is not a database"):
        BaselineStore(tmp_path / "notes.txt", create=False)
    sqlite3.connect(tmp_path / "other.sqlite").execute("CREATE TABLE t (x)")
    with pytest.raises(OSError, match="other.sqlite: it holds no baseline points table"):
        BaselineStore(tmp_path / "other.sqlite", create=False)


WRITER = textwrap.dedent("""
    import sys
    from slotune.store.baselines import BaselineStore
    store = BaselineStore(sys.argv[1])
    batch = 0
    while True:
        store.record_many(("gw", "p99_seconds", float(batch), batch * 50.0 + i, "prod", "d1") for i in range(50))
        batch += 1
        print(batch * 50, flush=True)
""")


def test_store_survives_kill_9_of_its_writer(tmp_path):
    path = tmp_path / "baselines.sqlite"
    child = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        committed = 0
        while committed < 10_000:
            committed = int(child.stdout.readline())
        with BaselineStore(path, create=False) as reader:  # `slotune baseline` while the daemon writes
            assert reader.summary("gw", "p99_seconds", "prod").count >= committed
        while committed < 20_000:
            committed = int(child.stdout.readline())
        child.send_signal(signal.SIGKILL)  # mid-transaction: the writer never pauses
        child.wait(timeout=10)
        for line in child.stdout:  # commits it reported before dying
            committed = int(line)
    finally:
        child.kill()
        child.wait()
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    db.close()
    with BaselineStore(path) as store:
        s = store.summary("gw", "p99_seconds", "prod")
    assert s.count >= committed and s.count % 50 == 0  # every reported commit, no half batch
    assert (s.first_t, s.last_t) == (0.0, s.count - 1.0)  # one point per t, so none missing


@pytest.fixture
def store_file(tmp_path):
    """A store as the daemon leaves it: two deploys of the gateway, one regressed."""
    path = tmp_path / "baselines.sqlite"
    rng = np.random.default_rng(3)
    with BaselineStore(path) as s:
        s.record_many(("gateway", "p99_seconds", v, 1_800_000_000 + i, "production", "v41")
                      for i, v in enumerate(rng.normal(0.200, 0.005, 300)))
        s.record_many(("gateway", "p99_seconds", v, 1_800_001_000 + i, "production", "v42")
                      for i, v in enumerate(rng.normal(0.250, 0.005, 300)))
    return path


def test_cli_lists_shows_and_diffs(store_file):
    listed = run_slotune("baseline", "list", "--store", str(store_file))
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines()[0].split()[:5] == ["SERVICE", "METRIC", "ENVIRONMENT", "DEPLOY", "POINTS"]
    assert listed.stdout.splitlines()[1].split()[:5] == ["gateway", "p99_seconds", "production", "v41", "300"]
    assert "2027-01-15" in listed.stdout  # times in UTC

    shown = run_slotune("baseline", "show", "gateway", "p99_seconds", "--deploy", "v41", "--store", str(store_file))
    assert shown.returncode == 0, shown.stderr
    fields = dict(line.split(None, 1) for line in shown.stdout.splitlines()[1:])
    assert fields["points"].startswith("300 from 2027-01-15")
    assert float(fields["mean"]) == pytest.approx(0.200, abs=0.002)

    diffed = run_slotune("baseline", "diff", "gateway", "--from", "v41", "--to", "v42", "--store", str(store_file))
    assert diffed.returncode == 0, diffed.stderr
    row = diffed.stdout.splitlines()[2].split()
    assert row[0] == "p99_seconds" and row[-1] == "yes"
    assert float(row[3].rstrip("%")) == pytest.approx(25.0, abs=1.5)  # mean change, percent


def test_cli_names_what_is_missing_and_what_is_known(store_file, tmp_path):
    missing = run_slotune("baseline", "list", "--store", str(tmp_path / "nope.sqlite"))
    assert missing.returncode == 2 and f"{tmp_path}/nope.sqlite does not exist" in missing.stderr
    service = run_slotune("baseline", "show", "inference", "p99_seconds", "--store", str(store_file))
    assert service.returncode == 2 and "'inference'" in service.stderr and "gateway (production)" in service.stderr
    metric = run_slotune("baseline", "show", "gateway", "p50_seconds", "--store", str(store_file))
    assert metric.returncode == 2 and "known metrics: p99_seconds" in metric.stderr
    deploy = run_slotune("baseline", "diff", "gateway", "--from", "v41", "--to", "v43", "--store", str(store_file))
    assert deploy.returncode == 2 and "no deploy 'v43'" in deploy.stderr and "known deploys: v41, v42" in deploy.stderr
    env = run_slotune("baseline", "show", "gateway", "p99_seconds", "--environment", "staging", "--store", str(store_file))
    assert env.returncode == 2 and "environment 'staging'" in env.stderr



def test_cli_takes_store_and_environment_from_the_config(store_file, tmp_path):
    example = (ROOT / "slotune.example.toml").read_text()
    config = tmp_path / "slotune.toml"
    for key, value in (("baseline_store", store_file), ("environment", "canary")):
        example, n = re.subn(rf'^{key} = "[^"]*"', f'{key} = "{value}"', example, flags=re.M)
        assert n == 1, f"slotune.example.toml has no daemon.{key} line"
    config.write_text(example)
    shown = run_slotune("baseline", "show", "gateway", "p99_seconds", "--config", str(config))
    assert shown.returncode == 2 and "environment 'canary'" in shown.stderr  # the config's environment
    shown = run_slotune("baseline", "show", "gateway", "p99_seconds", "--config", str(config),
                        "--environment", "production")
    assert shown.returncode == 0, shown.stderr
    assert "environment production" in shown.stdout and "points  600" in shown.stdout


def test_the_drift_tuner_gets_the_stored_history_with_its_robust_spread(tmp_path):
    from slotune import config
    from slotune.process import Daemon
    from slotune.store.recorder import DRIFT_METRIC
    from slotune.tuners import drift
    (tmp_path / "slotune.toml").write_text(textwrap.dedent(f"""
        [daemon]
        baseline_store = "{tmp_path}/baselines.sqlite"
        audit_log = "{tmp_path}/audit.jsonl"
        [services.gw]
        port = 8080
        """))
    daemon = Daemon(config.load(tmp_path / "slotune.toml"), collectors=[])
    values = [0.2, 0.21, 0.19, 0.2, 0.6, 0.2, 0.21]          # one outlier hour
    daemon.store.record_many(("gw", DRIFT_METRIC, v, 1000.0 + i, daemon.cfg.environment, "d1")
                             for i, v in enumerate(values))
    try:
        b = daemon.recorder.baseline("gw", since=0.0, until=2000.0)
    finally:
        daemon.close()
    assert b.windows == 7 and b.mean == pytest.approx(np.mean(values))
    assert b.robust_std == pytest.approx(drift.robust_std(values))
    assert b.robust_std < b.std / 5                            # the outlier hour barely moves it
