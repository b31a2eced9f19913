"""The Triton actuator against a stand-in for Triton's HTTP API (Triton cannot run
here), written from triton-inference-server/server docs/protocol/
extension_model_repository.md and extension_model_configuration.md: GET
/v2/models/<m>/config answers the model's config (64-bit fields as strings);
POST /v2/repository/models/<m>/load takes {"parameters": {"config": "<JSON>"}},
answers 200 with an empty body or 400 {"error": "..."}."""
import json

import pytest

from slotune.actuators import ActuatorError
from slotune.actuators.triton import TritonActuator
from tests.actuators.conftest import Answer

CONFIG = {"name": "resnet", "platform": "onnxruntime_onnx", "max_batch_size": 8,
          "dynamic_batching": {"preferred_batch_size": [4, 8], "max_queue_delay_microseconds": "100"}}


class TritonStandIn:
    def __init__(self, refuse: str = "", keep_old: bool = False):
        self.config, self.refuse, self.keep_old, self.loads = json.loads(json.dumps(CONFIG)), refuse, keep_old, []

    def __call__(self, r):
        if r.method == "GET" and r.path == "/v2/models/resnet/config":
            return Answer(body=self.config)
        if r.method == "POST" and r.path == "/v2/repository/models/resnet/load":
            body = r.json()
            assert set(body) == {"parameters"} and set(body["parameters"]) == {"config"}
            config = json.loads(body["parameters"]["config"])      # a string holding JSON, as documented
            self.loads.append(config)
            if self.refuse and config["max_batch_size"] > 8:
                return Answer(400, {"error": self.refuse})
            if not (self.keep_old and len(self.loads) == 1):
                self.config = config
            return Answer(body=b"", content_type="application/json")
        return Answer(404, {"error": "not found"})


def test_the_changed_fields_go_in_one_load_with_the_whole_config(http_stand_in):
    triton = TritonStandIn()
    s = http_stand_in(triton)
    a = TritonActuator(s.url, "resnet", {"max_queue_delay_ms": "dynamic_batching.max_queue_delay_microseconds"})
    assert a.current() == {"max_batch_size": 8.0, "max_queue_delay_ms": 0.1}
    a.push({"max_batch_size": 4.0, "max_queue_delay_ms": 2.0})
    assert len(triton.loads) == 1 and triton.loads[0] == {**CONFIG, "max_batch_size": 4, "dynamic_batching": {
        "preferred_batch_size": [4, 8], "max_queue_delay_microseconds": "2000"}}
    assert a.current() == {"max_batch_size": 4.0, "max_queue_delay_ms": 2.0}


def test_a_refused_load_and_a_config_that_did_not_change_are_refused_and_the_old_config_loaded(http_stand_in):
    triton = TritonStandIn(refuse="max_batch_size exceeds the model's maximum")
    s = http_stand_in(triton)
    with pytest.raises(ActuatorError, match="HTTP 400 .*exceeds the model's maximum.*the previous values are back"):
        TritonActuator(s.url, "resnet", {}).push({"max_batch_size": 16.0})
    assert triton.loads[-1] == CONFIG
    triton = TritonStandIn(keep_old=True)
    s = http_stand_in(triton)
    with pytest.raises(ActuatorError, match=r"max_batch_size = 8.0 \(pushed 4\)"):
        TritonActuator(s.url, "resnet", {}).push({"max_batch_size": 4.0})
    assert triton.loads[-1] == CONFIG


def test_inputs_triton_cannot_take_are_refused_before_any_load(http_stand_in):
    triton = TritonStandIn()
    s = http_stand_in(triton)
    with pytest.raises(ActuatorError, match="whole number"):
        TritonActuator(s.url, "resnet", {}).push({"max_batch_size": 2.5})
    with pytest.raises(ActuatorError, match="no 'sequence_batching' section"):
        TritonActuator(s.url, "resnet", {"x": "sequence_batching.max_sequence_idle_microseconds"}).push({"x": 5.0})
    assert triton.loads == []
    other = http_stand_in(lambda r: Answer(body=CONFIG))      # answers resnet's config whatever is asked
    with pytest.raises(ActuatorError, match="expected model 'bert'"):
        TritonActuator(other.url, "bert", {}).current()
