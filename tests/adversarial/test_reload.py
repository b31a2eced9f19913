"""SIGHUP with hostile or odd new configs, against a real `slotune run` watching a
real HTTP service: a folder, non-UTF-8 bytes, `downstream = [{}]`, a policy
switch, `dry_run = true`, a changed exporter address. The daemon stays up, a bad
file is refused naming what is wrong, and what it applies it applies at once."""
import signal
import time

import pytest

from reference_stack import launcher
from tests.adversarial.service_double import ServiceDouble, config
from tests.e2e.conftest import start_daemon

pytestmark = pytest.mark.slow


@pytest.fixture
def watched(tmp_path):
    """(daemon, double, work dir, exporter port): the daemon pushing rate limits to the double."""
    double = ServiceDouble({"rate_limit_rps": 500.0, "concurrency_limit": 64})
    port, work = launcher.free_ports(1)[0], tmp_path / "daemon"
    work.mkdir()
    d = start_daemon(config(double, port, work), work, port)
    try:
        wait(lambda: double.pushed() >= 2, 20, "the daemon's first pushes")
        yield d, double, work, port
    finally:
        if d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait(timeout=10)
        double.close()


def wait(cond, timeout_s, what):
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.2)


def hup_and_settle(d, marker_count: int, text: str):
    """SIGHUP, then wait until the log has said `text` once more than before."""
    d.proc.send_signal(signal.SIGHUP)
    wait(lambda: d.log().count(text) > marker_count, 10, f"{text!r} in the daemon's log")


@pytest.mark.parametrize("bad, reason", [
    ("folder", "is a folder"),
    ("non-utf8", "not UTF-8"),
    ("downstream-table", "lists service names"),
])
def test_a_bad_config_on_sighup_keeps_the_running_one(watched, bad, reason):
    d, double, work, _ = watched
    path = work / "slotune.toml"
    good = path.read_text()
    if bad == "folder":
        path.unlink()
        path.mkdir()
    elif bad == "non-utf8":
        path.write_bytes(good.encode() + b"\n# caf\xe9\n")
    else:
        path.write_text(good.replace("[services.svc.control]", "downstream = [{}]\n[services.svc.control]"))
    hup_and_settle(d, 0, "config reload refused")
    assert reason in d.log()
    before = double.pushed()
    wait(lambda: double.pushed() > before, 10, "pushes to go on under the running config")
    assert d.proc.poll() is None and "Traceback" not in d.log()


def test_a_policy_switch_on_sighup_starts_the_tuner_afresh(watched):
    d, double, work, port = watched
    (work / "slotune.toml").write_text(config(double, port, work, policy="vegas"))
    decided = len(d.audit())
    hup_and_settle(d, 0, "config reloaded")
    wait(lambda: len(d.audit()) >= decided + 3, 30, "three decisions of the new policy")
    assert d.proc.poll() is None
    log = d.log()
    assert "interval failed" not in log and "Traceback" not in log, log[-2000:]


def test_dry_run_on_sighup_stops_every_push(watched):
    d, double, work, port = watched
    (work / "slotune.toml").write_text(config(double, port, work, dry_run=True))
    hup_and_settle(d, 0, "dry-run is now on")

    def dry():
        return sum("dry" in e["outcome"] for e in d.audit())
    wait(lambda: dry() >= 1, 30, "a decision under dry_run")    # a push on its way at the signal has landed
    before, decided = double.pushed(), len(d.audit())
    wait(lambda: len(d.audit()) >= decided + 3, 30, "three more decisions under dry_run")
    assert double.pushed() == before, "the daemon kept pushing after dry_run = true was reloaded"
    outcomes = [e["outcome"] for e in d.audit()[-3:]]
    assert any("dry" in o for o in outcomes), outcomes


def test_a_changed_exporter_address_is_refused_loudly(watched):
    d, double, work, port = watched
    other = launcher.free_ports(1)[0]
    text = config(double, port, work).replace(f"127.0.0.1:{port}", f"127.0.0.1:{other}")
    (work / "slotune.toml").write_text(text)
    hup_and_settle(d, 0, "config reload refused")
    assert "daemon.exporter_address" in d.log() and "restart slotune" in d.log()
    assert d.status()["services"]["svc"]      # still serving where it was
