"""Hostile or merely odd config files: every float key as nan/inf/-inf, a folder,
non-UTF-8 bytes, an unreadable file, `downstream = [{}]`, an empty environment.
Each is refused at load with the file, the key and the fix; none raises anything
but ConfigError (so a reload keeps the running config)."""
import os
import re
import tomllib

import pytest

from slotune import config
from tests.conftest import ROOT

EXAMPLE = (ROOT / "slotune.example.toml").read_text()


def float_keys(table, where=""):
    """Dotted paths of every float value in the example config."""
    for key, value in table.items():
        path = f"{where}.{key}" if where else key
        if isinstance(value, dict):
            yield from float_keys(value, path)
        elif isinstance(value, float):
            yield path


FLOAT_KEYS = sorted(float_keys(tomllib.loads(EXAMPLE)))


def with_value(dotted: str, literal: str) -> str:
    """The example with one float key set to a TOML literal (nan, inf, -inf)."""
    *tables, key = dotted.split(".")
    lines, table = EXAMPLE.splitlines(), ""
    for i, line in enumerate(lines):
        header = re.match(r"\s*\[([^\]]+)\]", line)
        if header:
            table = header.group(1).strip()
        elif table == ".".join(tables) and re.match(rf"\s*{re.escape(key)}\s*=", line):
            lines[i] = f"{key} = {literal}"
            return "\n".join(lines)
    raise AssertionError(f"{dotted} not found as a line of the example")


def test_the_example_has_float_keys_to_try():
    assert len(FLOAT_KEYS) >= 10 and "daemon.collect_interval_s" in FLOAT_KEYS


@pytest.mark.parametrize("literal", ["nan", "inf", "-inf"])
@pytest.mark.parametrize("dotted", FLOAT_KEYS)
def test_every_float_key_refuses_a_non_finite_value(tmp_path, dotted, literal):
    path = tmp_path / "slotune.toml"
    path.write_text(with_value(dotted, literal))
    with pytest.raises(config.ConfigError) as err:
        config.load(path)
    assert err.value.key == dotted
    assert "finite" in err.value.reason or "outside" in err.value.reason


def test_a_folder_as_config(tmp_path):
    with pytest.raises(config.ConfigError, match="is a folder"):
        config.load(tmp_path)


def test_non_utf8_bytes(tmp_path):
    path = tmp_path / "slotune.toml"
    path.write_bytes(b"[services.api]\ncmdline = \"caf\xe9\"\n")
    with pytest.raises(config.ConfigError, match="not UTF-8"):
        config.load(path)


def test_an_unreadable_file(tmp_path):
    path = tmp_path / "slotune.toml"
    path.write_text(EXAMPLE)
    path.chmod(0)
    if os.access(path, os.R_OK):   # root reads mode-0 files: make it unreadable another way
        path.unlink()
        os.symlink(path, path)      # a link loop: ELOOP
    with pytest.raises(config.ConfigError, match="cannot read it"):
        config.load(path)


def test_downstream_of_a_table(tmp_path):
    path = tmp_path / "slotune.toml"
    path.write_text("[services.api]\nport = 80\ndownstream = [{}]\n")
    with pytest.raises(config.ConfigError) as err:
        config.load(path)
    assert err.value.key == "services.api.downstream" and "strings" in err.value.reason


def test_an_empty_environment(tmp_path):
    path = tmp_path / "slotune.toml"
    path.write_text("[daemon]\nenvironment = \"\"\n[services.api]\nport = 80\n")
    with pytest.raises(config.ConfigError) as err:
        config.load(path)
    assert err.value.key == "daemon.environment" and "empty" in err.value.reason


def test_the_guards_state_lives_beside_the_audit_log_unless_set(tmp_path):
    # Two daemons with their own audit logs never share pending judgements and holds.
    path = tmp_path / "slotune.toml"
    path.write_text(f'[daemon]\naudit_log = "{tmp_path}/a/audit.jsonl"\n[services.api]\nport = 80\n')
    assert config.load(path).state_file == f"{tmp_path}/a/state.json"
