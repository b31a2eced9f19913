"""The daemon's spec of each tuner (daemon/control/tuner_specs.py): one per tuner in
tuners.TUNERS, each builder gives its tuner's Observation, and the config reads every
tuner's own keys from its spec: defaults, ranges, unknown keys, the settings it pushes."""
import numpy as np
import pytest

from slotune import config
from slotune.config import ServiceConf
from slotune.control.observations import Inputs
from slotune.control.tuner_specs import SPECS
from slotune.model.histogram import Histogram
from slotune.model.service import ServiceSpec
from slotune.model.window import Window
from slotune.tuners import TUNERS
from slotune.tuners.drift import Baseline


def test_every_tuner_has_one_spec_and_it_names_the_tuner_s_module():
    assert list(SPECS) == list(TUNERS)
    for name, spec in SPECS.items():
        assert spec.module is TUNERS[name]
        assert all(o.low <= o.default <= o.high for o in spec.options), name
        assert (spec.alert is None) == bool(spec.settings), f"{name}: pushes settings or raises an alert, not both"


@pytest.mark.parametrize("name", list(SPECS))
def test_each_builder_gives_its_tuner_s_observation_from_plain_windows(name):
    spec = SPECS[name]
    windows = [Window("api", t, t + 1, 0.2, latency=Histogram.from_values(np.full(20, 50e6)), latency_source="service")
               for t in range(3)]
    conf = ServiceConf(ServiceSpec("api", cmdline="api", slo_p99_s=0.2))
    inputs = Inputs(3.0, windows, windows, conf, spec.option_values({}), 1.0,
                    lambda service, since, until: Baseline(mean=0.05, std=0.005, windows=100))
    obs = spec.observe(inputs)
    assert isinstance(obs, spec.module.Observation) and obs.now == 3.0


def service_for(name: str, table: str) -> str:
    """A service with a control surface, bounds for every setting the tuner pushes, and its table."""
    bounds = "".join(f"[services.api.settings.{s}]\nmin = 0\nmax = 100\nmax_step = 1\n"
                     for s in SPECS[name].pushes("slotune"))
    return (f"[services.api]\ncmdline = 'api'\nslo_ttft_p99_ms = 1000\nslo_tpot_p99_ms = 50\n[services.api.control]\nkind = 'file'\npath = '/tmp/api.json'\n"
            f"[services.api.tuners.{name}]\n{table}{bounds}")


@pytest.mark.parametrize("name", list(SPECS))
def test_the_config_reads_each_tuner_s_own_keys_from_its_spec(tmp_path, name):
    spec, path = SPECS[name], tmp_path / "slotune.toml"
    path.write_text(service_for(name, "".join(f"{o.name} = {o.high}\n" for o in spec.options)))
    assert config.load(path).service("api").tuners[0].options == {o.name: o.high for o in spec.options}
    path.write_text(service_for(name, ""))
    assert config.load(path).service("api").tuners[0].options == {o.name: o.default for o in spec.options}
    for o in spec.options:
        path.write_text(service_for(name, f"{o.name} = {o.high * 2 + 1}\n"))
        with pytest.raises(config.ConfigError, match="is outside") as err:
            config.load(path)
        assert err.value.key == f"services.api.tuners.{name}.{o.name}"


def test_a_key_of_another_tuner_is_refused_naming_the_keys_this_one_takes(tmp_path):
    path = tmp_path / "slotune.toml"
    path.write_text(service_for("sampling", "baseline_days = 3\n"))
    with pytest.raises(config.ConfigError) as err:
        config.load(path)
    assert err.value.key == "services.api.tuners.sampling.baseline_days"
    assert err.value.reason == ("unknown key; tuner sampling takes policy, interval_s, "
                                "budget_traces_per_s (traces/s to keep)")


def test_a_tuner_s_settings_need_bounds_and_an_alert_only_tuner_needs_no_control_surface(tmp_path):
    path = tmp_path / "slotune.toml"
    path.write_text(service_for("budget", "").split("[services.api.settings.llm_timeout_ms]")[0])
    with pytest.raises(config.ConfigError, match="tuner budget changes it") as err:
        config.load(path)
    assert err.value.key == "services.api.settings.llm_timeout_ms"
    path.write_text("[services.api]\ncmdline = 'api'\n[services.api.tuners.drift]\n")
    assert [t.name for t in config.load(path).service("api").tuners] == ["drift"]
