"""The SGLang actuator against a stand-in for an SGLang server (it needs a GPU),
written from sgl-project/sglang python/sglang/srt/entrypoints/http_server.py and
docs.sglang.io basic_usage/native_api.html: POST /set_internal_state takes
{"server_args": {...}} (admin key as a bearer token) and answers one bool per
data-parallel rank; GET /get_server_info answers the server arguments with an
"internal_states" list, one object per rank."""
import pytest

from slotune.actuators import ActuatorError
from slotune.actuators.sglang import SglangActuator
from tests.actuators.conftest import Answer, token_file


class SglangStandIn:
    def __init__(self, ranks: int = 2, refuse: bool = False):
        self.args = {"model_path": "qwen/qwen2.5-0.5b-instruct", "max_running_requests": 128, "tp_size": 1}
        self.states = [{"max_micro_batch_size": 32, "last_gen_throughput": 812.5} for _ in range(ranks)]
        self.refuse, self.bodies = refuse, []

    def __call__(self, r):
        if r.headers.get("authorization") != "Bearer admin-key":
            return Answer(401, {"error": "Unauthorized"})
        if r.method == "GET" and r.path == "/get_server_info":
            return Answer(body={**self.args, "internal_states": self.states, "version": "0.4.9"})
        if r.method in ("POST", "PUT") and r.path == "/set_internal_state":
            body = r.json()
            self.bodies.append(body)
            if self.refuse:
                return Answer(body=[False] * len(self.states))
            for state in self.states:
                state.update(body["server_args"])
            return Answer(body=[True] * len(self.states))
        return Answer(404, {"detail": "Not Found"})


def test_set_internal_state_read_back_from_every_rank(http_stand_in, tmp_path):
    sglang = SglangStandIn()
    s = http_stand_in(sglang)
    a = SglangActuator(s.url, {"max_num_seqs": "max_micro_batch_size"}, token_file(tmp_path, "admin-key"))
    assert a.current()["max_num_seqs"] == 32.0 and a.current()["max_running_requests"] == 128.0
    a.push({"max_num_seqs": 16.0})
    assert sglang.bodies == [{"server_args": {"max_micro_batch_size": 16}}]
    assert all(state["max_micro_batch_size"] == 16 for state in sglang.states)


def test_a_rank_that_did_not_update_is_refused_and_the_old_value_set_back(http_stand_in, tmp_path):
    sglang = SglangStandIn(refuse=True)
    s = http_stand_in(sglang)
    with pytest.raises(ActuatorError, match=r"did not take \['max_micro_batch_size'\].*\[False, False\]"):
        SglangActuator(s.url, {}, token_file(tmp_path, "admin-key")).push({"max_micro_batch_size": 16.0})
    assert sglang.bodies[-1] == {"server_args": {"max_micro_batch_size": 32}}


def test_an_unknown_argument_and_a_wrong_key_are_refused(http_stand_in, tmp_path):
    sglang = SglangStandIn()
    s = http_stand_in(sglang)
    with pytest.raises(ActuatorError, match="has no 'max_num_seqs'"):
        SglangActuator(s.url, {}, token_file(tmp_path, "admin-key")).push({"max_num_seqs": 16.0})
    with pytest.raises(ActuatorError, match="HTTP 401"):
        SglangActuator(s.url, {}, token_file(tmp_path, "wrong")).current()
    assert sglang.bodies == []
