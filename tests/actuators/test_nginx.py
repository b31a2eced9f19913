"""The nginx actuator's refusals, each naming the input and the fix, against a
real nginx where a push reaches it: a target that is not one directive, an
include file without (or with two of) a setting's line, a link for the include
file, a setting with no directive; and the config keys the kind needs. And the
clock its reload check reads: a child forked after the mark starts at or after it."""
import os
import subprocess
import time

import pytest

from slotune.config import ConfigError, load
from slotune.actuators import ActuatorError
from slotune.actuators.nginx import NginxActuator, _boot_ticks, workers
from slotune.profiles.nginx import target_error
from tests.actuators.real_servers import nginx

TARGETS = {"concurrency_limit": "limit_conn perserver {}"}


@pytest.mark.parametrize("target", ["limit_conn perserver", "limit_conn perserver {}; deny all",
                                    "limit_conn {} {}", "limit_conn perserver {} # x",
                                    "server 127.0.0.1:8000 max_conns={}\n}"])
def test_a_target_that_is_not_one_directive_with_one_value_is_refused(target):
    assert "is not one nginx directive" in target_error(target)
    assert target_error("limit_req zone=api burst={}") is None


def test_the_include_file_must_hold_each_setting_once_and_be_a_file(tmp_path):
    include, conf = tmp_path / "limits.conf", tmp_path / "nginx.conf"
    a = NginxActuator(str(include), str(conf), TARGETS)
    with pytest.raises(ActuatorError, match="does not exist: write it with a line per setting "
                                            "\\(`limit_conn perserver N;`\\)"):
        a.current()
    for text, count in (("# nothing yet\n", 0), ("limit_conn perserver 2;\nlimit_conn perserver 3;\n", 2)):
        include.write_text(text)
        with pytest.raises(ActuatorError, match=f"has {count} lines `limit_conn perserver N;` for setting "
                                                "concurrency_limit; it needs exactly one"):
            a.push({"concurrency_limit": 4.0})
        assert include.read_text() == text
    include.write_bytes(b"limit_conn perserver 2; # \xff\n")
    with pytest.raises(ActuatorError, match="is not UTF-8 text"):
        a.push({"concurrency_limit": 4.0})
    include.write_text("limit_conn perserver 2;\n")
    with pytest.raises(ActuatorError, match="setting batch has no nginx directive"):
        a.push({"batch": 4.0})
    link = tmp_path / "link.conf"
    os.symlink(include, link)
    with pytest.raises(ActuatorError, match="symbolic link"):
        NginxActuator(str(link), str(conf), TARGETS).current()


def test_a_push_changes_only_its_number_and_keeps_mode_and_owner(tmp_path):
    text = "# slotune's\n  limit_conn   perserver 2;   # per server\nlimit_rate 100k;\n"
    with nginx(tmp_path / "nginx", text) as ng:
        os.chmod(ng.include, 0o604)
        NginxActuator(str(ng.include), str(ng.conf), {"concurrency_limit": "limit_conn   perserver {}"}).push(
            {"concurrency_limit": 5.0})
        assert ng.include.read_text() == text.replace("perserver 2;", "perserver 5;")
        assert oct(os.stat(ng.include).st_mode & 0o777) == "0o604"


def test_a_worker_counts_for_the_reload_only_when_it_started_after_the_reload_was_sent():
    """The kernel's start times (proc(5) stat field 22) against the mark the push takes."""
    before = subprocess.Popen(["sleep", "5"])
    try:
        time.sleep(0.05)                 # five ticks at USER_HZ 100
        mark = _boot_ticks()
        after = subprocess.Popen(["sleep", "5"])
        try:
            starts = workers(os.getpid())
            assert starts[before.pid] < mark <= starts[after.pid], (starts, mark)
        finally:
            after.kill()
            after.wait()
    finally:
        before.kill()
        before.wait()


def _config(tmp_path, control: str):
    path = tmp_path / "slotune.toml"
    path.write_text(f"[services.web]\nport = 80\n[services.web.control]\n{control}\n")
    return path


def test_config_refuses_an_nginx_control_without_what_it_needs(tmp_path):
    targets = '[services.web.control.targets]\nconcurrency_limit = "limit_conn perserver {}"'
    ok = f'kind = "nginx"\npath = "/etc/nginx/slotune.conf"\nconf = "/etc/nginx/nginx.conf"\n{targets}'
    assert load(_config(tmp_path, ok)).service("web").control.options["binary"] == "/usr/sbin/nginx"
    for text, key in [(f'kind = "nginx"\nconf = "/c"\n{targets}', "path"),
                      (f'kind = "nginx"\npath = "/p"\n{targets}', "conf"),
                      ('kind = "nginx"\npath = "/p"\nconf = "/c"', "targets")]:
        with pytest.raises(ConfigError) as err:
            load(_config(tmp_path, text))
        assert err.value.key == f"services.web.control.{key}" and "the nginx actuator needs" in err.value.reason
