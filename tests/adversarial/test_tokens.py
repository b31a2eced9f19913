"""Token files as a root daemon meets them: a link, a device, a FIFO, a file too
large, two lines, a mode that lets others write. Each is refused before anything
is sent, by a message that names the file and never holds the token, and a
server that echoes the token back does not get it into the log or the audit log.
The reference stack refuses to keep its token in a folder others control."""
from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from slotune.actuators import Control
from slotune.config import Bounds, Config, ServiceConf, TunerConf
from slotune.actuators import ActuatorError
from slotune.actuators.http_json import HttpJsonActuator
from slotune.store.audit import AuditLog
from slotune.model.interval import Interval
from slotune.control.loop import ControlLoop
from slotune.model.service import ServiceSpec
from tests.adversarial.conftest import header, reply
from tests.conftest import ROOT
from tests.test_control import window

TOKEN = "s3cret-token-42"


def refused(server, token_path) -> ActuatorError:
    with pytest.raises(ActuatorError) as err:
        HttpJsonActuator(server.url, str(token_path), settings_key="settings", timeout_s=1.0).current()
    assert str(token_path) in str(err.value)
    assert server.requests == []          # refused before anything was sent
    return err.value


def test_a_good_token_file_sends_its_token(serve, token_file):
    server = serve(reply(200, b'{"settings": {"rate": 5}}'))
    assert HttpJsonActuator(server.url, str(token_file), settings_key="settings").current() == {"rate": 5.0}
    assert header(server.requests[0], "Authorization") == f"Bearer {TOKEN}"


def test_a_symlink_is_refused(serve, token_file, tmp_path):
    link = tmp_path / "link.token"
    link.symlink_to(token_file)
    err = refused(serve(reply(200)), link)
    assert "symbolic link" in str(err) and TOKEN not in str(err)


@pytest.mark.timeout(10)
def test_dev_zero_is_refused_without_reading_it(serve):
    assert "not a regular file" in str(refused(serve(reply(200)), "/dev/zero"))


@pytest.mark.timeout(10)
def test_a_fifo_is_refused_without_waiting_for_a_writer(serve, tmp_path):
    fifo = tmp_path / "fifo.token"
    os.mkfifo(fifo, 0o600)
    assert "not a regular file" in str(refused(serve(reply(200)), fifo))


def test_a_1_mib_file_is_refused(serve, tmp_path):
    big = tmp_path / "big.token"
    big.write_text("a" * (1 << 20))
    big.chmod(0o600)
    err = refused(serve(reply(200)), big)
    assert "larger than 4096 bytes" in str(err) and "aaaa" not in str(err)


@pytest.mark.parametrize("contents", ["first-line\nsecond-line\n", "first-line\rsecond-line"],
                         ids=["two-lines", "a-carriage-return-inside"])
def test_two_lines_are_refused_without_quoting_either(serve, tmp_path, contents):
    path = tmp_path / "two.token"
    path.write_text(contents)
    path.chmod(0o600)
    err = refused(serve(reply(200)), path)
    assert "holds 2 lines" in str(err) and "first" not in str(err) and "second" not in str(err)


@pytest.mark.parametrize("contents", ["", "\n"], ids=["empty", "a-newline"])
def test_an_empty_token_file_is_refused(serve, tmp_path, contents):
    path = tmp_path / "empty.token"
    path.write_text(contents)
    path.chmod(0o600)
    assert "holds 0 lines" in str(refused(serve(reply(200)), path))


def test_a_token_with_a_space_is_refused_without_quoting_it(serve, tmp_path):
    path = tmp_path / "space.token"
    path.write_text("half token\n")
    path.chmod(0o600)
    err = refused(serve(reply(200)), path)
    assert "cannot go in an HTTP header" in str(err) and "half" not in str(err)


@pytest.mark.parametrize("mode, who", [(0o666, "group and others"), (0o620, "group"), (0o602, "others")],
                         ids=["mode-0666", "mode-0620", "mode-0602"])
def test_a_token_file_others_can_write_is_refused(serve, token_file, mode, who):
    token_file.chmod(mode)
    err = refused(serve(reply(200)), token_file)
    assert f"writable by {who} (mode {mode:04o}); chmod go-w {token_file}" in str(err) and not err.unreachable


def test_a_missing_token_file_is_unreachable_not_refused(serve, tmp_path):
    err = refused(serve(reply(200)), tmp_path / "not-yet.token")
    assert "does not exist" in str(err) and err.unreachable


def echo_token(conn, request, _stopped):
    """GET answers settings; PATCH answers 400 with the request's Authorization header in the reason."""
    if request.startswith(b"GET"):
        return reply(200, b'{"settings": {"rate_limit_rps": 100}}')(conn, request, _stopped)
    body = f'{{"error": "bad token {header(request, "Authorization")}"}}'.encode()
    return reply(400, body)(conn, request, _stopped)


def test_a_server_that_echoes_the_token_does_not_get_it_into_errors_logs_or_the_audit_log(
        serve, token_file, tmp_path, caplog):
    server = serve(echo_token)
    conf = ServiceConf(ServiceSpec("api", cmdline="api", slo_p99_s=0.2),
                       control=Control("reference", {"url": server.url, "token_file": str(token_file), "method": "PATCH"}),
                       tuners=(TunerConf("throttle", "whitepaper", 1.0),),
                       settings={"rate_limit_rps": Bounds(10.0, 1000.0, 50.0)})
    audit = AuditLog(tmp_path / "audit.jsonl")
    actuator = HttpJsonActuator(server.url, str(token_file), settings_key="settings")
    control = ControlLoop(Config(path="t", services=(conf,)), {"api": actuator}, audit, False)
    with caplog.at_level(logging.DEBUG):
        entries = control.tick(Interval.at(1.0, {"api": [window(1.0, 0.5)]}))
    audit.close()
    assert [str(e.outcome) for e in entries] == ["push failed"]
    assert "Bearer <token>" in entries[0].detail + entries[0].reason + str(entries[0].outcome)
    logged = (tmp_path / "audit.jsonl").read_text() + caplog.text + repr(entries)
    assert TOKEN not in logged


def stack_init(run_dir) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "reference_stack", "init", "--run-dir", str(run_dir)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_the_stack_makes_a_new_run_folder_only_its_user_can_enter(tmp_path):
    result = stack_init(tmp_path / "run")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "run").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "run" / "admin.token").stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("mode, words", [(0o1777, "writable by others (mode 1777)"),
                                         (0o770, "writable by others (mode 0770)")],
                         ids=["world-writable-like-tmp", "group-writable"])
def test_the_stack_refuses_a_run_folder_others_can_write(tmp_path, mode, words):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    run_dir.chmod(mode)
    result = stack_init(run_dir)
    assert result.returncode == 1 and words in result.stderr and f"chmod 700 {run_dir}" in result.stderr
    assert not (run_dir / "admin.token").exists()


def test_the_stack_refuses_a_run_folder_another_user_owns(tmp_path, root_only):
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    os.chown(run_dir, 65534, 65534)
    result = stack_init(run_dir)
    assert result.returncode == 1 and "belongs to uid 65534" in result.stderr
    assert not (run_dir / "admin.token").exists()


def test_the_stack_refuses_a_run_folder_that_is_a_link(tmp_path):
    (tmp_path / "real").mkdir(mode=0o700)
    (tmp_path / "run").symlink_to(tmp_path / "real")
    result = stack_init(tmp_path / "run")
    assert result.returncode == 1 and "is not a folder (a symbolic link?)" in result.stderr
    assert not (tmp_path / "real" / "admin.token").exists()
