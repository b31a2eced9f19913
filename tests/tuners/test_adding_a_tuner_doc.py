"""docs/extending.md "Adding a tuner" shows the budget tuner as it is: every piece of
code it quotes is in the repository as quoted, its config loads, and the daemon's
config reference (docs/daemon.md) gives every tuner key its spec's default and range."""
import re

from slotune import config
from slotune.control.tuner_specs import SPECS
from tests.conftest import ROOT

DOC = (ROOT / "docs" / "extending.md").read_text()
SECTION = DOC[DOC.index("## Adding a tuner"):]
QUOTED = ("tuners/budget.py", "tuners/__init__.py", "daemon/control/observations.py",
          "daemon/control/tuner_specs.py", "reference_stack/gateway.py", "tests/test_control.py",
          "tests/stack/test_gateway.py")


def blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```$", SECTION, re.S | re.M)


def test_every_piece_of_code_it_quotes_is_the_repository_s():
    files = {path: (ROOT / path).read_text() for path in QUOTED}
    for block in blocks("python"):
        for piece in re.split(r"(?m)^\.\.\.\n", block):
            assert any(piece in text for text in files.values()), f"not in {', '.join(QUOTED)}:\n{piece}"


def test_the_config_it_shows_loads_with_its_keys(tmp_path):
    [toml] = blocks("toml")
    path = tmp_path / "slotune.toml"
    path.write_text("[services.gateway]\ncmdline = 'reference_stack gateway'\nslo_p99_ms = 800\n"
                    "[services.gateway.control]\nkind = 'file'\npath = '/tmp/gateway.json'\n" + toml)
    [tuner] = config.load(path).service("gateway").tuners
    assert (tuner.name, tuner.policy, tuner.interval_s) == ("budget", "slotune", 10.0)
    assert tuner.options == {"gateway_slo_ms": 100.0, "tool_slo_ms": 300.0, "llm_slo_ms": 400.0}


def test_the_config_reference_gives_every_tuner_key_its_spec_s_default_and_range():
    reference = (ROOT / "docs" / "daemon.md").read_text()
    for spec in SPECS.values():
        for o in spec.options:
            row = re.search(rf"^\| `{o.name}` \| float \| ([^|]+) \| ([^|]+)\.\.([^|]+) \|", reference, re.M)
            assert row, f"docs/daemon.md has no row for {spec.name}'s {o.name}"
            assert tuple(float(v) for v in row.groups()) == (o.default, o.low, o.high), o.name
