"""Config loading: the shipped example is valid, and every kind of mistake is
refused with the file, the key and the reason."""
import pytest

from slotune import config
from tests.conftest import ROOT

MINIMAL = """
[services.api]
cmdline = "myapi"
slo_p99_ms = 250
"""


def load_text(tmp_path, text):
    path = tmp_path / "slotune.toml"
    path.write_text(text)
    return config.load(path)


def test_the_shipped_example_loads():
    cfg = config.load(ROOT / "slotune.example.toml")
    gateway = cfg.service("gateway")
    assert gateway.spec.slo_p99_s == pytest.approx(0.8)
    assert gateway.spec.peers == {8100: "inference", 8443: "sidecar"}
    assert {t.name for t in gateway.tuners} == {"throttle", "sampling", "drift"}
    assert cfg.service("inference").settings["max_batch_size"].max_step == 8


def test_untimed_paths_and_the_metrics_path(tmp_path):
    cfg = load_text(tmp_path, MINIMAL + 'metrics_url = "http://127.0.0.1:8000/metrics?x=1"\n'
                                        'untimed_paths = ["/healthz", "/metrics"]\n')
    assert cfg.service("api").spec.untimed() == ("/healthz", "/metrics")
    assert load_text(tmp_path, MINIMAL).service("api").spec.untimed() == ()


def test_routes_are_path_prefixes_in_order(tmp_path):
    cfg = load_text(tmp_path, MINIMAL + 'routes = ["/v1/chat/completions", "/v1/completions", "/v1"]\n')
    assert cfg.service("api").spec.routes == ("/v1/chat/completions", "/v1/completions", "/v1")
    assert load_text(tmp_path, MINIMAL).service("api").spec.routes == ()


def test_defaults_for_a_minimal_file(tmp_path):
    cfg = load_text(tmp_path, MINIMAL)
    assert cfg.collect_interval_s == 1.0 and cfg.tune_interval_s is None
    assert cfg.exporter_host_port == ("127.0.0.1", 9477)
    assert cfg.service("api").spec.slo_p99_s == pytest.approx(0.25)


@pytest.mark.parametrize("text, key, reason", [
    (MINIMAL + "colour = 'blue'\n", "services.api.colour", "unknown key"),
    ("[daemon]\ncollect_intervall_s = 1\n" + MINIMAL, "daemon.collect_intervall_s", "unknown key"),
    ("[daemon]\ncollect_interval_s = 0\n" + MINIMAL, "daemon.collect_interval_s", "outside"),
    ("[daemon]\ncollect_interval_s = 'fast'\n" + MINIMAL, "daemon.collect_interval_s", "must be float"),
    ("[daemon]\nexporter_address = 'nope'\n" + MINIMAL, "daemon.exporter_address", "HOST:PORT"),
    ("[daemon]\nprobes = ['kprobe']\n" + MINIMAL, "daemon.probes", "unknown probe family"),
    ("[services.api]\nslo_p99_ms = 100\n", "services.api", "needs at least one of"),
    ("[services.api]\ncmdline = '(['\n", "services.api.cmdline", "regular expression"),
    ("[services.api]\nport = 70000\n", "services.api.port", "outside"),
    (MINIMAL + "peers = { web = 'x' }\n", "services.api.peers.web", "remote TCP ports"),
    (MINIMAL + "peers = { 8100 = 'route=x' }\n", "services.api.peers.8100", "use no '=' or ','"),
    (MINIMAL + "downstream = ['db']\n", "services.api.downstream", "not a declared service"),
    (MINIMAL + "untimed_paths = ['healthz']\n", "services.api.untimed_paths", "starting with '/'"),
    (MINIMAL + "untimed_paths = ['/a?b']\n", "services.api.untimed_paths", "not a path"),
    (MINIMAL + "untimed_paths = ['/h z']\n", "services.api.untimed_paths", "not a path"),
    (MINIMAL + "routes = ['v1/completions']\n", "services.api.routes", "starting with '/'"),
    (MINIMAL + f"routes = ['/{'x' * 64}']\n", "services.api.routes", "up to 64 printable characters"),
    (MINIMAL + "routes = ['/v1/completions?stream=true']\n", "services.api.routes", "not a path"),
    (MINIMAL + f"routes = {[f'/r{i}' for i in range(9)]}\n", "services.api.routes", "at most 8"),
    (MINIMAL + "routes = ['/v1', '/v1/completions']\n", "services.api.routes", "'/v1', listed before it, starts it"),
    (MINIMAL + "routes = ['/v1/models', '/v1/models']\n", "services.api.routes", "never be matched"),
    (MINIMAL + "routes = '/v1/completions'\n", "services.api.routes", "must be list"),
    (MINIMAL + "[services.api.tuners.throttle]\n", "services.api.tuners.throttle", "needs a [control] table"),
    (MINIMAL + "[services.api.tuners.autopilot]\n", "services.api.tuners.autopilot", "unknown tuner"),
    (MINIMAL + "[services.api.control]\nkind = 'reference'\nurl = 'x'\n[services.api.tuners.throttle]\n",
     "services.api.control.url", "http(s) URL"),
    (MINIMAL + "[services.api.control]\nkind = 'reference'\nurl = 'http://127.0.0.1:1/admin/config'\n"
               "[services.api.tuners.throttle]\n", "services.api.settings.concurrency_limit", "needs min, max"),
    (MINIMAL + "[services.api.control]\nkind = 'file'\npath = '/tmp/x.json'\n[services.api.tuners.throttle]\n"
               "[services.api.settings.rate_limit_rps]\nmin = 10\nmax = 1\nmax_step = 1\n",
     "services.api.settings.rate_limit_rps.min", "above max"),
    (MINIMAL + "[services.api.control]\nkind = 'file'\npath = '/tmp/x.json'\n"
               "[services.api.tuners.throttle]\npolicy = 'magic'\n"
               "[services.api.settings.rate_limit_rps]\nmin = 1\nmax = 10\nmax_step = 1\n",
     "services.api.tuners.throttle.policy", "magic"),
    ("[daemon]\n", "services", "no services declared"),
    ("this is = not toml =", "-", "not valid TOML"),
])
def test_bad_config_is_refused_naming_file_key_and_reason(tmp_path, text, key, reason):
    with pytest.raises(config.ConfigError) as err:
        load_text(tmp_path, text)
    assert err.value.key == key
    assert reason in err.value.reason
    assert str(tmp_path / "slotune.toml") in str(err.value)


def test_missing_file_names_the_path_and_the_fix(tmp_path):
    with pytest.raises(config.ConfigError, match="file not found; copy slotune.example.toml"):
        config.load(tmp_path / "absent.toml")
