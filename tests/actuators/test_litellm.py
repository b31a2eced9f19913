"""The LiteLLM actuator against a stand-in for the LiteLLM proxy (not installed
here), written from docs.litellm.ai/docs/proxy/virtual_keys: POST /key/update
with the master key as a bearer token and {"key": "sk-...", "max_parallel_requests":
N, "rpm_limit": N} answers the updated key; GET /key/info?key=sk-... answers
{"key": ..., "info": {...}}; a wrong master key gets 401."""
import pytest

from slotune.actuators import ActuatorError
from slotune.actuators.litellm import LitellmActuator
from tests.actuators.conftest import Answer, token_file

VIRTUAL_KEY = "sk-team-a-1234"


class LitellmStandIn:
    def __init__(self, cap: int | None = None):
        self.info = {"key_name": "sk-...1234", "spend": 3.2, "max_parallel_requests": None, "rpm_limit": 600,
                     "tpm_limit": None, "models": []}
        self.cap, self.updates = cap, []      # cap: the proxy keeps max_parallel_requests at most this

    def __call__(self, r):
        if r.headers.get("authorization") != "Bearer sk-master":
            return Answer(401, {"error": {"message": "Authentication Error, invalid proxy server token"}})
        if r.method == "GET" and r.path == "/key/info" and r.query == {"key": VIRTUAL_KEY}:
            return Answer(body={"key": VIRTUAL_KEY, "info": self.info})
        if r.method == "POST" and r.path == "/key/update":
            body = r.json()
            if body.get("key") != VIRTUAL_KEY:
                return Answer(404, {"error": {"message": "Key not found"}})
            self.updates.append(body)
            for k, v in body.items():
                if k != "key":
                    self.info[k] = min(v, self.cap) if self.cap and k == "max_parallel_requests" and v else v
            return Answer(body={"key": VIRTUAL_KEY, **self.info})
        return Answer(404, {"detail": "Not Found"})


def _actuator(url, tmp_path, master="sk-master"):
    (tmp_path / "m").mkdir(exist_ok=True)
    key = tmp_path / "virtual.key"
    key.write_text(VIRTUAL_KEY + "\n")
    key.chmod(0o600)
    return LitellmActuator(url, str(key), {"concurrency_limit": "max_parallel_requests", "rate_limit_rps": "rpm_limit"},
                           token_file(tmp_path / "m", master))


def test_key_update_read_back_from_key_info(http_stand_in, tmp_path):
    litellm = LitellmStandIn()
    s = http_stand_in(litellm)
    a = _actuator(s.url, tmp_path)
    assert a.current() == {"rate_limit_rps": 10.0}                 # 600 a minute
    a.push({"concurrency_limit": 8.0, "rate_limit_rps": 5.0})
    assert litellm.updates == [{"max_parallel_requests": 8, "rpm_limit": 300, "key": VIRTUAL_KEY}]
    assert a.current() == {"concurrency_limit": 8.0, "rate_limit_rps": 5.0}


def test_a_rate_goes_out_as_a_whole_number_a_minute_and_the_rounding_is_not_a_failed_read_back(http_stand_in, tmp_path):
    litellm = LitellmStandIn()
    a = _actuator(http_stand_in(litellm).url, tmp_path)
    a.push({"rate_limit_rps": 2.509})                              # 150.54 a minute
    assert litellm.updates[-1]["rpm_limit"] == 151 and a.current()["rate_limit_rps"] == 151 / 60
    a.push({"rate_limit_rps": 0.001})                              # never 0 a minute: that would stop the key
    assert litellm.updates[-1]["rpm_limit"] == 1


def test_a_limit_the_proxy_did_not_keep_is_refused_and_set_back_to_unset(http_stand_in, tmp_path):
    litellm = LitellmStandIn(cap=4)
    s = http_stand_in(litellm)
    with pytest.raises(ActuatorError, match=r"concurrency_limit = 4.0 \(pushed 8\).*the previous values are back"):
        _actuator(s.url, tmp_path).push({"concurrency_limit": 8.0})
    assert litellm.updates[-1] == {"max_parallel_requests": None, "key": VIRTUAL_KEY}
    assert litellm.info["max_parallel_requests"] is None


def test_the_virtual_key_never_appears_in_a_message(http_stand_in, tmp_path):
    s = http_stand_in(LitellmStandIn())
    with pytest.raises(ActuatorError) as err:
        _actuator(s.url, tmp_path, master="sk-wrong").current()
    assert "HTTP 401" in str(err.value) and VIRTUAL_KEY not in str(err.value) and "<key>" in str(err.value)
    with pytest.raises(ActuatorError, match="not a LiteLLM key limit"):
        _actuator(s.url, tmp_path).push({"batch": 3.0})
