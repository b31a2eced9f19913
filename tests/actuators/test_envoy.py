"""The Envoy actuator against a stand-in for Envoy's admin interface (Envoy cannot
run here), written from envoyproxy.io/docs/envoy/latest/operations/admin:
POST /runtime_modify takes the keys as query parameters and answers "OK\\n"
(an empty value removes an override); GET /runtime answers {"layers": [...],
"entries": {key: {"final_value": "...", "layer_values": [...]}}}."""
import pytest

from slotune.actuators import ActuatorError
from slotune.actuators.envoy import EnvoyActuator
from slotune.profiles.envoy import target_error
from tests.actuators.conftest import Answer

KEY = "circuit_breakers.inference.default.max_requests"


class EnvoyStandIn:
    def __init__(self, values: dict[str, str], ignore: tuple[str, ...] = ()):
        self.values, self.ignore = dict(values), ignore     # ignore: keys it says OK to but does not change

    def __call__(self, r):
        if r.method == "GET" and r.path == "/runtime":
            return Answer(body={"layers": ["static_layer_0", "admin"], "entries": {
                k: {"final_value": v, "layer_values": [v, ""]} for k, v in self.values.items()}})
        if r.method == "POST" and r.path == "/runtime_modify" and r.query and not r.body:
            for k, v in r.query.items():
                if k in self.ignore:
                    continue
                if v == "":
                    self.values.pop(k, None)
                else:
                    self.values[k] = v
            return Answer(body=b"OK\n", content_type="text/plain")
        return Answer(400, b"usage: /runtime_modify?key1=value1&key2=value2&keyN=valueN\n", "text/plain")


def test_one_runtime_modify_for_the_decision_read_back_from_runtime(http_stand_in):
    envoy = EnvoyStandIn({KEY: "64", "upstream.use_http2": "true"})
    s = http_stand_in(envoy)
    a = EnvoyActuator(s.url, {"concurrency_limit": KEY})
    assert a.current() == {"concurrency_limit": 64.0}
    a.push({"concurrency_limit": 12.0, "adaptive_concurrency.gradient_controller.sample_aggregate_percentile": 95.0})
    posts = [r for r in s.requests if r.method == "POST"]
    assert len(posts) == 1 and posts[0].path == "/runtime_modify" and posts[0].query == {
        KEY: "12", "adaptive_concurrency.gradient_controller.sample_aggregate_percentile": "95"}
    assert envoy.values[KEY] == "12" and envoy.values["upstream.use_http2"] == "true"


def test_a_value_envoy_did_not_take_is_refused_and_every_key_set_back(http_stand_in):
    envoy = EnvoyStandIn({KEY: "64"}, ignore=(KEY,))
    s = http_stand_in(envoy)
    with pytest.raises(ActuatorError, match=r"concurrency_limit = 64.0 \(pushed 12\).*the previous values are back"):
        EnvoyActuator(s.url, {"concurrency_limit": KEY}).push({"concurrency_limit": 12.0, "new.key": 3.0})
    assert s.requests[-1].query == {KEY: "64", "new.key": ""}     # new.key had no value: removed
    assert envoy.values == {KEY: "64"}


def test_an_answer_that_is_not_envoys_is_refused(http_stand_in):
    s = http_stand_in(lambda r: Answer(body={"runtime": []}))
    with pytest.raises(ActuatorError, match="/runtime: expected Envoy's"):
        EnvoyActuator(s.url, {}).current()
    s = http_stand_in(lambda r: Answer(body={"entries": {}}) if r.method == "GET" else Answer(body=b"done"))
    with pytest.raises(ActuatorError, match="expected Envoy's OK, got 'done'"):
        EnvoyActuator(s.url, {}).push({"k": 1.0})
    assert target_error("a.b_c-1") is None and "not an Envoy runtime key" in target_error("a b")
