"""Full BPF maps drop entries, and slotune says so: with every map shrunk to 64
entries, a watched worker that sleeps 160 different durations (far more
histogram slots than 64) and holds 200 forked children at once overflows `hists`
(in the kernel) and `watched` (at fork, in the kernel, and at the daemon's own
rescan), and the scheduler families' LRU maps evict; the collector stays up,
collect() never raises, slotune_bpf_map_full_total{map} counts the drops and
slotune_bpf_map_evicted_total{map} the evictions, each said once per map in the
log. With the default sizes the same workload loses nothing. The sizes come from
daemon.bpf_map_entries, which refuses unknown maps and sizes out of range. How an
eviction count is read (evictions.py) is checked on made-up counts."""
import logging

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from slotune import config
from slotune.collectors.kernel.evictions import Evictions
from slotune.collectors.kernel.program import EVICTING, MAP_ENTRIES, REFUSING, program_text
from slotune.process import Daemon
from slotune.model.service import ServiceSpec
from tests.probes.conftest import collected, kernel, spawn, tag  # noqa: F401 (fixtures)

SHRUNK = dict.fromkeys(MAP_ENTRIES, 64)
SLEEPS, CHILDREN = 160, 200
FAMILIES = ["offcpu", "runqueue"]


def lost(collector, metric: str = "slotune_bpf_map_full_total") -> dict[str, float]:
    """A metric per map (by default slotune_bpf_map_full_total), as /metrics shows it."""
    registry = CollectorRegistry()
    for extra in collector.metric_families():
        registry.register(extra)
    text = generate_latest(registry).decode()
    return {s.labels["map"]: s.value for f in text_string_to_metric_families(text)
            for s in f.samples if s.name == metric}


EVICTED = "slotune_bpf_map_evicted_total"


def run_workload(collector, worker) -> None:
    """go (sleeps, forks), an interval while the children live, release, an interval."""
    assert worker.stdout.readline().strip() == "ready"
    collector.refresh()
    collected(collector)
    worker.stdin.write("go\n")
    worker.stdin.flush()
    assert worker.stdout.readline().strip() == "forked"
    assert "spreader" in collected(collector)   # the daemon's rescan finds all 201 processes
    worker.stdin.write("release\n")
    worker.stdin.flush()
    assert worker.stdout.readline().strip() == "done"
    assert "spreader" in collected(collector)


@pytest.mark.kernel
def test_full_maps_are_counted_and_said_once_and_the_collector_goes_on(kernel, spawn, tag, caplog):  # noqa: F811
    collector = kernel([ServiceSpec("spreader", cmdline=f"spreader.py {tag}")], FAMILIES, SHRUNK)
    worker = spawn("spreader", tag, SLEEPS, CHILDREN)
    with caplog.at_level(logging.WARNING, logger="slotune.collectors.kernel.map_full"):
        run_workload(collector, worker)
        for _ in range(3):
            collected(collector)
    assert collector.up
    full, evicted = lost(collector), lost(collector, EVICTED)
    assert set(full) == set(REFUSING) and set(evicted) == set(EVICTING)
    assert full["hists"] > 0 and full["watched"] > 0, full
    assert evicted["offcpu_since"] > 0 or evicted["runqueue_since"] > 0, evicted
    # The daemon's own refused inserts into `watched` count beside the kernel's.
    assert full["watched"] > collector.program.map_full()["watched"] > 0
    said = [r.getMessage() for r in caplog.records]
    for name, verb in [("hists", "drops new entries"), ("watched", "drops new entries"),
                       *[(name, "evicts its least recently used entries") for name, n in evicted.items() if n]]:
        lines = [m for m in said if m.startswith(f"BPF map {name} is full")]
        assert len(lines) == 1, said
        assert f"(64 entries) and {verb}" in lines[0] and f"daemon.bpf_map_entries.{name}" in lines[0]


@pytest.mark.kernel
def test_default_sizes_drop_nothing_under_the_same_workload(kernel, spawn, tag):  # noqa: F811
    collector = kernel([ServiceSpec("spreader", cmdline=f"spreader.py {tag}")], FAMILIES)
    run_workload(collector, spawn("spreader", tag, SLEEPS, CHILDREN))
    assert lost(collector) == dict.fromkeys(REFUSING, 0.0)
    assert lost(collector, EVICTED) == dict.fromkeys(EVICTING, 0.0)


def test_the_sizes_reach_the_generated_defines():
    text = program_text([], {"hists": 64, "watched": 128, "http_conns": 256})
    assert "#define MAX_HISTS 64\n" in text and "#define MAX_WATCHED 128\n" in text
    assert "#define MAX_HTTP_CONNS 256\n" in text
    assert f"#define MAX_COUNTS {MAP_ENTRIES['counts']}\n" in text


class Counted:
    """A Program as Evictions reads it: an LRU map's counts and entries, which move
    while its entries are counted when `meanwhile` says how."""

    def __init__(self, inserted: int, deleted: int, held: int):
        self.inserted, self.deleted, self.held = inserted, deleted, held
        self.meanwhile = (0, 0, 0)   # inserted, deleted, held: added while counting
        self.counted = 0

    def lru_maps(self):
        return ["http_conns"]

    def lru_changes(self):
        return {"http_conns": (self.inserted, self.deleted)}

    def entries(self, name):
        self.counted += 1
        held = self.held
        self.inserted, self.deleted, self.held = (a + b for a, b in zip((self.inserted, self.deleted, self.held),
                                                                       self.meanwhile))
        self.meanwhile = (0, 0, 0)
        return held


def test_an_eviction_count_is_exact_when_nothing_moves_and_never_high_when_something_does():
    program, evictions = Counted(inserted=100, deleted=30, held=60), Evictions()
    assert evictions.read(program) == {"http_conns": 10}
    assert evictions.read(program) == {"http_conns": 10} and program.counted == 1   # no change: not counted again
    # Two new keys held; while counting, one more came in (after the inserts were read)
    # and an entry counted as held was then deleted: neither reads as an eviction.
    program.inserted, program.held, program.meanwhile = program.inserted + 2, program.held + 2, (1, 1, 0)
    assert evictions.read(program) == {"http_conns": 10}
    assert evictions.read(program) == {"http_conns": 10} and program.counted == 3   # counted again: it moved
    program.inserted, program.held = program.inserted + 5, program.held + 2        # 3 of 5 new ones evicted
    assert evictions.read(program) == {"http_conns": 13} and program.counted == 4


MINIMAL = "[services.api]\ncmdline = 'myapi'\n"


def test_the_config_key_sets_some_sizes_and_keeps_the_defaults_of_the_rest(tmp_path):
    path = tmp_path / "slotune.toml"
    path.write_text("[daemon]\nbpf_map_entries = { hists = 131072 }\n" + MINIMAL)
    assert config.load(path).bpf_map_entries == {**MAP_ENTRIES, "hists": 131072}
    path.write_text(MINIMAL)
    assert config.load(path).bpf_map_entries == MAP_ENTRIES


def test_the_daemon_builds_its_kernel_collector_with_the_sizes_and_keeps_them_on_reload(tmp_path):
    path = tmp_path / "slotune.toml"
    head = f"[daemon]\nbaseline_store = '{tmp_path}/b.sqlite'\naudit_log = '{tmp_path}/audit.jsonl'\n"
    path.write_text(head + "bpf_map_entries = { watched = 128 }\n" + MINIMAL)
    daemon = Daemon(config.load(path))
    try:
        kernel_collector = next(c for c in daemon.collectors if c.name == "kernel")
        assert kernel_collector.map_entries == {**MAP_ENTRIES, "watched": 128}
        assert 'slotune_bpf_map_full_total{map="watched"} 0.0' in generate_latest(daemon.registry).decode()
        path.write_text(head + "bpf_map_entries = { watched = 256 }\n" + MINIMAL)
        assert not daemon.reload() and daemon.cfg.bpf_map_entries["watched"] == 128
    finally:
        daemon.close()


@pytest.mark.parametrize("value, key, reason", [
    ("{ buckets = 1024 }", "daemon.bpf_map_entries.buckets", f"no BPF map 'buckets'; known: {', '.join(MAP_ENTRIES)}"),
    ("{ hists = 0 }", "daemon.bpf_map_entries.hists", "outside 64..4194304"),
    ("{ watched = 8388608 }", "daemon.bpf_map_entries.watched", "outside 64..4194304"),
    ("{ counts = 1024.0 }", "daemon.bpf_map_entries.counts", "must be int"),
    ("{ watched = true }", "daemon.bpf_map_entries.watched", "must be int"),
    ("4096", "daemon.bpf_map_entries", "must be a table"),
])
def test_a_bad_size_is_refused_naming_the_key(tmp_path, value, key, reason):
    path = tmp_path / "slotune.toml"
    path.write_text(f"[daemon]\nbpf_map_entries = {value}\n" + MINIMAL)
    with pytest.raises(config.ConfigError) as err:
        config.load(path)
    assert err.value.key == key and reason in err.value.reason
