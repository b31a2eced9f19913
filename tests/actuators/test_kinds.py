"""The config picks each actuator by kind, and refuses a [control] table that lacks
what its kind needs or names a target the kind cannot push, by key."""
import pytest

from slotune.config import ConfigError, load
from slotune.actuators import for_control
from slotune.actuators.envoy import EnvoyActuator
from slotune.actuators.litellm import LitellmActuator
from slotune.actuators.sglang import SglangActuator
from slotune.actuators.triton import TritonActuator


def _load(tmp_path, control: str):
    path = tmp_path / "slotune.toml"
    path.write_text(f"[services.s]\nport = 8000\n[services.s.control]\n{control}\n")
    return load(path).service("s").control


@pytest.mark.parametrize("control, kind", [
    ('kind = "envoy"\nurl = "http://127.0.0.1:9901"', EnvoyActuator),
    ('kind = "triton"\nurl = "http://127.0.0.1:8000"\nmodel = "resnet"', TritonActuator),
    ('kind = "sglang"\nurl = "http://127.0.0.1:30000"', SglangActuator),
    ('kind = "litellm"\nurl = "http://127.0.0.1:4000"\nkey_file = "/etc/slotune/team-a.key"', LitellmActuator)])
def test_each_kind_gets_its_actuator(tmp_path, control, kind):
    assert isinstance(for_control(_load(tmp_path, control)), kind)


@pytest.mark.parametrize("control, key, why", [
    ('kind = "envoy"', "url", "needs an http(s) URL"),
    ('kind = "triton"\nurl = "http://h:8000"', "model", "the model's name"),
    ('kind = "litellm"\nurl = "http://h:4000"', "key_file", "virtual key"),
    ('kind = "litellm"\nurl = "http://h:4000"\nkey_file = "/k"\n[services.s.control.targets]\nc = "budget"',
     "targets.c", "not a LiteLLM key limit"),
    ('kind = "triton"\nurl = "http://h:8000"\nmodel = "m"\n[services.s.control.targets]\nc = "Dynamic Batching"',
     "targets.c", "dotted field path"),
    ('kind = "sglang"\nurl = "http://h"\n[services.s.control.targets]\nc = "max-running"', "targets.c",
     "not an SGLang server argument")])
def test_what_a_kind_lacks_is_refused_by_key(tmp_path, control, key, why):
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, control)
    assert err.value.key == f"services.s.control.{key}" and why in err.value.reason
