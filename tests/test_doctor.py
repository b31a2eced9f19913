"""`slotune doctor` against the live kernel, and its verdict logic."""
import argparse

from slotune.host import kernel_features as kf
from slotune.commands import doctor
from tests.conftest import run_slotune


def lines_by_check(stdout: str) -> dict[str, str]:
    out = {}
    for line in stdout.splitlines():
        if line and line[0] in "✓✗":
            mark, rest = line[0], line[2:]
            out[rest[:15].strip()] = mark + " " + rest[15:].strip()
    return out


def test_doctor_on_this_host_reports_probe_kinds_and_exits_0(root_only):
    result = run_slotune("doctor")
    assert result.returncode == 0, result.stdout + result.stderr
    checks = lines_by_check(result.stdout)
    assert checks["tracepoint"].startswith("✓")
    assert checks["uprobe"].startswith("✓")
    if not kf.kprobes_configured():
        assert checks["kprobe"].startswith("✗") and "CONFIG_KPROBES" in checks["kprobe"]
    assert checks["fentry"].startswith("✓") or "EPERM" in checks["fentry"] or "BTF" in checks["fentry"]
    assert "the daemon can run" in result.stdout


def test_every_failed_check_carries_a_fix(root_only):
    result = run_slotune("doctor")
    lines = result.stdout.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("✗"):
            assert "fix:" in lines[i + 1], f"no fix after: {line}"


def test_missing_tracefs_makes_the_daemon_unable_to_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(kf, "TRACEFS", tmp_path / "tracing")
    rc = doctor.run(argparse.Namespace(config=None, prometheus_url=None, redis_url=None))
    out = capsys.readouterr().out
    assert rc == 1
    assert "mount -t tracefs nodev" in out
    assert "the daemon cannot run: tracefs, probes failed" in out


def test_unreachable_redis_and_prometheus_are_reported_with_a_fix():
    # Port 1 on loopback is never listening here; the checks must say so, not raise.
    redis = doctor.check_redis("redis://127.0.0.1:1")
    prom = doctor.check_prometheus("http://127.0.0.1:1")
    assert not redis.ok and "not reachable" in redis.detail and redis.fix
    assert not prom.ok and "not reachable" in prom.detail and prom.fix


def test_header_release_reads_utsrelease(tmp_path):
    gen = tmp_path / "include" / "generated"
    gen.mkdir(parents=True)
    (gen / "utsrelease.h").write_text('#define UTS_RELEASE "6.1.0-57-cloud-amd64"\n')
    assert kf.header_release(tmp_path) == "6.1.0-57-cloud-amd64"


def test_a_bad_config_is_a_failed_check_naming_the_key(tmp_path, root_only):
    bad = tmp_path / "slotune.toml"
    bad.write_text("[daemon]\nprometheus_url = 5\n[services.a]\ncmdline = 'a'\n")
    result = run_slotune("doctor", "--config", str(bad))
    assert result.returncode == 1
    assert "daemon.prometheus_url: must be str" in result.stdout


def test_the_configs_prometheus_is_checked(tmp_path, root_only):
    cfg = tmp_path / "slotune.toml"
    cfg.write_text("[daemon]\nprometheus_url = 'http://127.0.0.1:1'\n[services.a]\ncmdline = 'a'\n")
    result = run_slotune("doctor", "--config", str(cfg))
    assert result.returncode == 0
    assert "✓ config" in result.stdout and "✗ Prometheus" in result.stdout
