"""Programs started per service: two services each run a known number of
programs per round (one of them exec'd from a second thread, whose task id
changes on exec) while an unwatched process runs its own; each service counts
exactly the programs it started, round after round."""
from slotune.model.service import ServiceSpec
from tests.probes.agreement import record
from tests.probes.conftest import collected

KEY = ("process_execs", "")
RUNS = {"a": 20, "b": 5, "unwatched": 10}     # per round, plus one from a thread


def test_each_service_counts_exactly_the_programs_it_started(kernel, spawn, tag):
    collector = kernel([ServiceSpec("a", cmdline=f"execer.py {tag}-a"),
                        ServiceSpec("b", cmdline=f"execer.py {tag}-b")], ["exec"])
    workers = {name: spawn("execer", f"{tag}-{name}", n) for name, n in RUNS.items()}
    for p in workers.values():
        assert p.stdout.readline().strip() == "ready"
    collector.refresh()
    collected(collector)
    for _ in range(2):
        for p in workers.values():
            p.stdin.write("go\n")
            p.stdin.flush()
        for p in workers.values():
            assert p.stdout.readline().strip() == "done"
        samples = collected(collector)
        assert set(samples) == {"a", "b"}
        for name in ("a", "b"):
            record("programs started (exec)", "the programs each service started", samples[name].counters.get(KEY, 0),
                   RUNS[name] + 1, "execs", "exact")
            assert samples[name].counters.get(KEY) == RUNS[name] + 1, name
