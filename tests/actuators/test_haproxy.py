"""The HAProxy actuator against a real HAProxy (Debian's 2.6) over its admin
socket, and against a stand-in socket for the answers a real one would not give
(a wrong read-back, garbage, a refusal half-way): each refused, naming the
input, and nothing left half-applied."""
import time

import pytest

from slotune.config import ConfigError, load
from slotune.actuators import ActuatorError, for_control
from slotune.actuators.haproxy import HaproxyActuator
from tests.actuators.real_servers import haproxy

TARGETS = {"concurrency_limit": "maxconn server be_app/app", "frontend_limit": "maxconn frontend fe_main",
           "session_rate": "rate-limit sessions global"}


def test_real_haproxy_takes_the_limits_and_reports_them_in_force(tmp_path):
    with haproxy(tmp_path / "hp", backend_port=9, maxconn=64) as hp:
        a = HaproxyActuator(hp.socket, TARGETS)
        assert a.current() == {"concurrency_limit": 64.0, "frontend_limit": 1000.0, "session_rate": 0.0}
        a.push({"concurrency_limit": 12.0, "session_rate": 300.0})
        assert hp.stat("be_app", "app")["slim"] == "12"          # read independently of the actuator
        assert a.current() == {"concurrency_limit": 12.0, "frontend_limit": 1000.0, "session_rate": 300.0}
        b = HaproxyActuator(hp.socket, {**TARGETS, "other": "maxconn server be_app/nosuch"})
        with pytest.raises(ActuatorError, match="be_app/nosuch"):
            b.push({"concurrency_limit": 20.0, "other": 5.0})
        assert hp.stat("be_app", "app")["slim"] == "12", "a push that named an unknown server changed another"


def test_a_value_haproxy_would_misread_is_refused_before_any_command(tmp_path, socket_stand_in):
    stand_in = socket_stand_in(lambda line: "\n")
    a = HaproxyActuator(stand_in.path, TARGETS)
    for value, why in ((0.0, "0 means no limit"), (3.5, "whole number"), (-1.0, "whole number"),
                       (float(2**31), "whole number")):
        with pytest.raises(ActuatorError, match=why) as err:
            a.push({"concurrency_limit": value})
        assert "concurrency_limit" in str(err.value) and "nothing was set" in str(err.value)
    with pytest.raises(ActuatorError, match="no HAProxy limit: add it to \\[control.targets\\]"):
        a.push({"batch": 4.0})
    assert stand_in.commands == []


class FakeHaproxy:
    """The stand-in's answers, in HAProxy 2.6's formats (management guide 9.3): `show stat` CSV
    with a slim column, `show info` lines, an empty line for an accepted `set`. reported(row,
    value) is what `show stat` says for a row: a lie when a test wants one."""

    def __init__(self):
        self.slim = {("be_app", "app"): 64, ("fe_main", "FRONTEND"): 1000}
        self.reported = lambda row, value: value
        self.refuse = {}      # command prefix -> HAProxy's refusal

    def __call__(self, line: str) -> str:
        for prefix, why in self.refuse.items():
            if line.startswith(prefix):
                return why
        if line == "show stat":
            rows = [f"{px},{sv},0,0,0,0,{self.reported((px, sv), v)},0" for (px, sv), v in self.slim.items()]
            return "# pxname,svname,qcur,qmax,scur,smax,slim,stot,\n" + "\n".join(rows) + "\n\n"
        if line == "show info":
            return "Name: HAProxy\nVersion: 2.6.12\nSessRateLimit: 0\n\n"
        words = line.split()
        if words[:3] == ["set", "maxconn", "server"]:
            self.slim[tuple(words[3].split("/"))] = int(words[4])
        elif words[:3] == ["set", "maxconn", "frontend"]:
            self.slim[(words[3], "FRONTEND")] = int(words[4])
        return "\n"


def test_a_read_back_that_disagrees_is_refused_and_set_back(socket_stand_in):
    fake = FakeHaproxy()
    fake.reported = lambda row, value: 4294967295 if row == ("be_app", "app") and value == 7 else value
    stand_in = socket_stand_in(fake)
    with pytest.raises(ActuatorError) as err:
        HaproxyActuator(stand_in.path, TARGETS).push({"concurrency_limit": 7.0, "frontend_limit": 500.0})
    message = str(err.value)
    assert "concurrency_limit = 4294967295.0 (pushed 7)" in message and "set back" in message
    assert stand_in.commands[-3:-1] == ["set maxconn server be_app/app 64", "set maxconn frontend fe_main 1000"]
    assert fake.slim == {("be_app", "app"): 64, ("fe_main", "FRONTEND"): 1000}, "left half-applied"


def test_a_refusal_half_way_sets_back_the_first_setting(socket_stand_in):
    fake = FakeHaproxy()
    fake.refuse = {"set maxconn frontend": "No such frontend.\n\n"}
    stand_in = socket_stand_in(fake)
    with pytest.raises(ActuatorError, match="refused 'set maxconn frontend fe_main 500' \\(setting frontend_limit\\)"
                                            ": No such frontend.; set back concurrency_limit = 64"):
        HaproxyActuator(stand_in.path, TARGETS).push({"concurrency_limit": 7.0, "frontend_limit": 500.0})
    assert fake.slim[("be_app", "app")] == 64


class Late:
    """FakeHaproxy answering the n-th command (counting from 1) `late_s` late: HAProxy on a saturated host."""

    def __init__(self, fake: FakeHaproxy, n: int, late_s: float):
        self.fake, self.n, self.late_s, self.seen = fake, n, late_s, 0

    def __call__(self, line: str) -> str:
        self.seen += 1
        answer = self.fake(line)
        if self.seen == self.n:
            time.sleep(self.late_s)
        return answer


def test_a_read_back_answered_late_is_read_again_and_the_push_stands(socket_stand_in):
    fake = FakeHaproxy()
    stand_in = socket_stand_in(Late(fake, 3, 0.5))      # show stat, set, then the late show stat
    HaproxyActuator(stand_in.path, TARGETS, timeout_s=0.2).push({"concurrency_limit": 7.0})
    assert stand_in.commands == ["show stat", "set maxconn server be_app/app 7", "show stat", "show stat"]
    assert fake.slim[("be_app", "app")] == 7


def test_a_set_answered_too_late_is_set_back_as_if_it_had_landed(socket_stand_in):
    fake = FakeHaproxy()
    stand_in = socket_stand_in(Late(fake, 2, 0.5))      # the set lands, its answer is late
    with pytest.raises(ActuatorError, match="no complete answer to 'set maxconn server be_app/app 7'.*"
                                            "set back concurrency_limit = 64") as err:
        HaproxyActuator(stand_in.path, TARGETS, timeout_s=0.2).push({"concurrency_limit": 7.0})
    assert err.value.unreachable and fake.slim[("be_app", "app")] == 64, "left half-applied"


@pytest.mark.parametrize("answer, says", [
    ("Unknown command. Please enter one of the following commands only :\n", "is not its CSV"),
    ("# pxname,svname,qcur\nbe_app,app,0\n", "no slim column"),
    ("# pxname,svname,slim\nbe_app,app,lots\nfe_main,FRONTEND,1000\n", "'lots', not a whole number"),
    ("# pxname,svname,slim\nbe_app,app,\nfe_main,FRONTEND,1000\n", "has no limit in haproxy.cfg"),
])
def test_a_bad_answer_to_show_stat_is_refused_naming_it_and_nothing_is_set(socket_stand_in, answer, says):
    stand_in = socket_stand_in(lambda line: answer if line == "show stat" else "Name: HAProxy\n")
    a = HaproxyActuator(stand_in.path, {"concurrency_limit": TARGETS["concurrency_limit"]})
    with pytest.raises(ActuatorError, match=says):
        a.push({"concurrency_limit": 7.0})
    assert not [c for c in stand_in.commands if c.startswith("set ")]


def test_an_unreachable_socket_is_unreachable(tmp_path):
    with pytest.raises(ActuatorError) as err:
        HaproxyActuator(str(tmp_path / "none.sock"), TARGETS).current()
    assert err.value.unreachable and "none.sock" in str(err.value)


def _config(tmp_path, control: str):
    path = tmp_path / "slotune.toml"
    path.write_text(f"[services.front]\nport = 8080\n[services.front.control]\n{control}\n")
    return path


def test_config_picks_the_haproxy_actuator_and_refuses_what_it_cannot_use(tmp_path):
    ok = 'kind = "haproxy"\naddress = "127.0.0.1:9999"\n[services.front.control.targets]\n' \
         'concurrency_limit = "maxconn server be/s1"'
    control = load(_config(tmp_path, ok)).service("front").control
    assert isinstance(for_control(control), HaproxyActuator) and control.targets == {
        "concurrency_limit": "maxconn server be/s1"}
    for text, key, why in [
        ('kind = "haproxy"\n[services.front.control.targets]\nx = "maxconn global"', "control.address",
         "stats socket"),
        ('kind = "haproxy"\naddress = "/run/haproxy/admin.sock"', "control.targets", "concurrency_limit = "),
        ('kind = "haproxy"\naddress = "/s"\n[services.front.control.targets]\nx = "maxconn backend be"',
         "control.targets.x", "not a HAProxy limit"),
        ('kind = "file"\npath = "/s"\n[services.front.control.targets]\nx = "y"', "control.targets.x",
         "takes no [control.targets]")]:
        with pytest.raises(ConfigError) as err:
            load(_config(tmp_path, text))
        assert err.value.key == f"services.front.{key}" and why in err.value.reason
