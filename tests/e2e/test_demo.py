"""`slotune demo` (what `make demo` runs), shortened: it must start everything,
tune, write its report with the plots, and leave nothing running."""
import re
import subprocess

from tests.conftest import run_slotune


def test_a_short_demo_writes_its_report_and_cleans_up(tmp_path, root_only):
    run_dir = tmp_path / "demo"
    result = run_slotune("demo", "--run-dir", str(run_dir), "--scale", "0.15", timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "measuring the stack's capacity" in result.stdout
    assert re.search(r"1\.5x capacity: offered [0-9.]+ req/s", result.stdout)
    report = (run_dir / "report.html").read_text()
    assert report.count("<img") >= 4                     # latency and settings plots for both services
    assert "gateway" in report and "inference" in report
    assert f"report: {run_dir / 'report.html'}" in result.stdout
    leftover = subprocess.run(["pgrep", "-f", str(run_dir)], capture_output=True, text=True).stdout
    assert leftover == "", f"processes left running: {leftover}"


def test_the_report_counts_only_this_runs_decisions_when_the_run_dir_is_reused(tmp_path):
    from daemon.demo.run import this_runs_decisions
    log = tmp_path / "audit.jsonl"
    log.write_text('{"t": 100.0, "outcome": "pushed"}\n{"t": 200.0, "outcome": "rolled back"}\n\n'
                   '{"t": 300.0, "outcome": "pushed"}\n')
    assert this_runs_decisions(log, since=250.0) == [{"t": 300.0, "outcome": "pushed"}]
