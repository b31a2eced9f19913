"""`slotune demo` and `slotune demo --llm` (what `make demo` runs, one after the other), shortened: each
must start everything, tune, write its report with the plots, and leave nothing running."""
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


def test_the_llm_demo_streams_a_load_step_judged_on_ttft_and_tpot(tmp_path, root_only):
    run_dir = tmp_path / "llm-demo"
    result = run_slotune("demo", "--llm", "--run-dir", str(run_dir), "--scale", "0.2", timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "/v1/completions: 1.0 req/s for 6 s, then 3.0 req/s for 12 s" in result.stdout
    for phase in ("calm", "3x calm", "back to calm"):
        assert re.search(rf"\n{phase}: offered [0-9.]+ req/s, completed [0-9.]+ req/s, goodput [0-9.]+ req/s "
                         r"\(requests meeting both SLOs\), TTFT P99 \d+ ms \((under|OVER) its 500 ms SLO\), "
                         r"TPOT P99 \d+ ms \((under|OVER) its 50 ms SLO\)", result.stdout), phase
    config = (run_dir / "slotune.toml").read_text()
    assert "slo_ttft_p99_ms = 500.0" in config and "slo_tpot_p99_ms = 50.0" in config
    assert 'ttft_metric = "inference_time_to_first_token_seconds"' in config
    assert "[services.inference.tuners.continuous_batch]" in config
    report = (run_dir / "report.html").read_text()
    assert '<img alt="inference tokens"' in report and '<img alt="inference settings"' in report
    leftover = subprocess.run(["pgrep", "-f", str(run_dir)], capture_output=True, text=True).stdout
    assert leftover == "", f"processes left running: {leftover}"


def test_the_report_counts_only_this_runs_decisions_when_the_run_dir_is_reused(tmp_path):
    from slotune.demo.run import this_runs_decisions
    log = tmp_path / "audit.jsonl"
    log.write_text('{"t": 100.0, "outcome": "pushed"}\n{"t": 200.0, "outcome": "rolled back"}\n\n'
                   '{"t": 300.0, "outcome": "pushed"}\n')
    assert this_runs_decisions(log, since=250.0) == [{"t": 300.0, "outcome": "pushed"}]


def test_the_report_plots_ttft_and_tpot_only_for_a_service_that_declares_them(tmp_path):
    from slotune.demo import report

    def service(t, tokens):
        row = {"p50_s": 1.0, "p99_s": 2.0, "slo_p99_s": 30.0, "rate_rps": 2.0, "goodput_rps": 1.0, "settings": {},
               "attribution": {"shares": {}, "tokens": {"ttft": {"shares": {"queue": 0.7}}}} if tokens else None}
        if tokens:
            row.update(slo_ttft_p99_s=0.5, slo_tpot_p99_s=0.05, ttft_p99_s=0.1 * t, tpot_p99_s=None)
        return row
    snaps = [{"t": 100.0 + t, "services": {"inference": service(t, True), "gateway": service(t, False)}}
             for t in range(8)]
    page = report.write(tmp_path / "report.html", snaps, [], [(101.0, "calm")], ["one line"]).read_text()
    assert re.findall(r'<img alt="([^"]+)"', page) == ["inference latency", "inference tokens",
                                                       "inference TTFT attribution", "gateway latency"]


def test_an_llm_phase_line_judges_the_clients_ttft_and_tpot_and_counts_goodput():
    from slotune.demo.run import Phase, llm_phase_lines
    from reference_stack.llm.load import LlmRecord
    good = LlmRecord(0.1, 0.0, 0.2, 0.28, 200, 10, 5, 5, [0.02] * 4)     # TTFT 200 ms, TPOT 20 ms
    slow = LlmRecord(0.5, 0.0, 0.9, 1.7, 200, 10, 5, 5, [0.2] * 4)       # TTFT 900 ms, TPOT 200 ms
    failed = LlmRecord(1.0, 0.0, float("nan"), float("nan"), 404, 10, 5, 0, error="model")
    [line] = llm_phase_lines([(Phase("calm", 1.0, 2.0), 0.0, [good, slow, failed])])
    assert line.startswith("calm: offered 1.5 req/s, completed 1.0 req/s, goodput 0.5 req/s (requests meeting both SLOs)")
    assert "TTFT P99 893 ms (OVER its 500 ms SLO)" in line and "TPOT P99 198 ms (OVER its 50 ms SLO)" in line
