"""[export] keys: each mistake refused with the key and the fix; a reload that changes one is refused."""
import logging
import textwrap

import pytest

from slotune import config
from slotune.process import Daemon
from tests.export.conftest import SetLatency

BASE = '[services.api]\ncmdline = "api"\n'


def load(tmp_path, export: str):
    (tmp_path / "s.toml").write_text(BASE + "[export]\n" + textwrap.dedent(export))
    return config.load(tmp_path / "s.toml")


@pytest.mark.parametrize("export, key, says", [
    ('grafana_url = "grafana:3000"\ngrafana_token_file = "/t"', "export.grafana_url", "not an http(s) URL"),
    ('grafana_url = "http://g:3000"', "export.grafana_token_file", "service-account token with the Editor role"),
    ('otlp_endpoint = "http://c:4318/v1/logs"', "export.otlp_endpoint", "base URL"),
    ('otlp_endpoint = "c:4318"', "export.otlp_endpoint", "not an http(s) URL"),
    ("otlp_metrics_interval_s = 0.1", "export.otlp_metrics_interval_s", "outside 1.0..3600.0"),
    ('grafana = "http://g"', "export.grafana", "unknown key"),
    ("buckets_per_octave = 3", "export.buckets_per_octave", "not one of 1, 2, 4, 8"),
    ("buckets_per_octave = 4.0", "export.buckets_per_octave", "must be int"),
])
def test_bad_export_keys_are_refused_with_the_key(tmp_path, export, key, says):
    with pytest.raises(config.ConfigError) as err:
        load(tmp_path, export)
    assert err.value.key == key and says in err.value.reason


def test_the_defaults_send_nothing_anywhere(tmp_path):
    cfg = load(tmp_path, "")
    assert (cfg.export.grafana_url, cfg.export.otlp_endpoint) == ("", "")


def test_the_exported_latency_histograms_have_the_buckets_asked_for(tmp_path):
    (tmp_path / "s.toml").write_text(BASE + f'[daemon]\naudit_log = "{tmp_path}/a.jsonl"\n'
                                     f'baseline_store = "{tmp_path}/b.sqlite"\n[export]\nbuckets_per_octave = 2\n')
    daemon = Daemon(config.load(tmp_path / "s.toml"), collectors=[SetLatency()])
    try:
        assert len(daemon.exporter.bounds_s) == 52 and daemon.exporter.bounds_s[:3] == (1.024e-06, 1.536e-06, 2.048e-06)
    finally:
        daemon.close()
    assert load(tmp_path, "").export.buckets_per_octave == 8        # every slot's edge: a P99 within 5 %


def test_a_reload_that_changes_export_is_refused(tmp_path, caplog):
    (tmp_path / "s.toml").write_text(BASE + f'[daemon]\naudit_log = "{tmp_path}/a.jsonl"\n'
                                     f'baseline_store = "{tmp_path}/b.sqlite"\n')
    daemon = Daemon(config.load(tmp_path / "s.toml"), collectors=[SetLatency()])
    try:
        (tmp_path / "s.toml").write_text((tmp_path / "s.toml").read_text() + '[export]\notlp_endpoint = "http://c:4318"\n')
        with caplog.at_level(logging.ERROR, logger="slotune.process"):
            assert not daemon.reload()
        assert "daemon.export" in caplog.text and "restart slotune" in caplog.text
        assert daemon.sinks.sinks == []
    finally:
        daemon.close()
