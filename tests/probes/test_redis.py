"""Redis commands timed from a real redis-server's own sockets (the redis family), each
figure against an account slotune did not write: the commands by class and the error
replies against Redis's own INFO (commandstats, errorstats), every class's summed time
between Redis's own execution time (commandstats usec: the floor, as a command's time
from its read to its reply holds its execution) and the client's clock (the ceiling),
a slow script against Redis's own SLOWLOG, and a pipeline of 20 GETs read in one go
counted as 20. The client (tests/probes/workers/redis_calls.py) is a watched service
too: its own connection, whose replies look like commands, is never taken for a
server's. The same again with the Redis in a network namespace of its own (a
container's), beside a Redis on the same port in another namespace that a client of
its own keeps busy and that slotune does not watch."""
import json
import re
import subprocess
import time
import uuid

import pytest
import redis

from slotune.model.histogram import slot_bounds
from slotune.model.service import ServiceSpec
from slotune.model.signals import REDIS_ARRIVED, REDIS_COMMAND, REDIS_ERRORS
from slotune.collectors.kernel.families.redis import CLASSES, COMMANDS
from tests.probes.agreement import record
from tests.probes.conftest import collected
from tests.probes.test_tcp import remove_namespace, veth_namespace
from tests.probes.workers.redis_calls import BLOCK_S, PIPELINED, SINGLE, SPIN_MS

FAMILIES = ["http", "redis", "tls"]      # the socket families together, as the daemon runs them
INSIDE_SCRIPT = "cmdstat_time"     # the spinning script's own calls: counted by Redis, no network command
OWN_AFTER = 3        # the test's commands after its last INFO commandstats: that one, INFO stats, SLOWLOG GET


def class_of(command: str) -> str:
    """A commandstats entry's class (cmdstat_client|setinfo -> client -> other)."""
    name = command.removeprefix("cmdstat_").split("|")[0].upper()
    return next((cls for cls, names in COMMANDS.items() if name in names.split()), "other")


def calls(before: dict, after: dict) -> dict[str, tuple[int, float]]:
    """Per class, (commands run, microseconds Redis spent in them) between two INFO commandstats,
    those a script ran inside itself aside."""
    out = {cls: (0, 0.0) for cls in CLASSES}
    for command, now in after.items():
        if command == INSIDE_SCRIPT:
            continue
        then = before.get(command, {})
        n = sum(now.get(k, 0) - then.get(k, 0) for k in ("calls", "rejected_calls"))
        usec = now["usec"] - then.get("usec", 0)
        cls = class_of(command)
        out[cls] = (out[cls][0] + n, out[cls][1] + usec)
    return out


@pytest.fixture(params=["here", "own namespace"])
def cache(request, tmp_path, spawn, tag):
    """(the watched Redis's ServiceSpec, its address, its port), here or in a namespace of its own
    beside an unwatched one on the same port, busy with a client of its own."""
    if request.param == "here":
        yield ServiceSpec("cache", port=request.getfixturevalue("redis_port")), "127.0.0.1", \
            request.getfixturevalue("redis_port")
        return
    request.getfixturevalue("root_only")
    port, made = 20000 + uuid.uuid4().int % 20000, []
    first = 10 + uuid.uuid4().int % 100 * 2
    try:
        for i, who in enumerate(("watched", "decoy")):
            name = f"sltr{uuid.uuid4().hex[:6]}"
            made.append(name)
            _, _, addr = veth_namespace(name, f"10.215.{first + i}")
            (tmp_path / who).mkdir()
            server = subprocess.Popen(["ip", "netns", "exec", name, "redis-server", "--port", str(port), "--bind",
                                       addr, "--protected-mode", "no", "--save", "", "--appendonly", "no",
                                       "--dir", str(tmp_path / who)], stdout=subprocess.DEVNULL)
            made.append(server)
            deadline = time.monotonic() + 10
            while True:
                try:
                    redis.Redis(host=addr, port=port, socket_timeout=1).ping()
                    break
                except redis.ConnectionError:
                    assert server.poll() is None and time.monotonic() < deadline, "redis-server did not start"
                    time.sleep(0.05)
            if who == "watched":
                watched = addr
            else:
                busy = spawn("redis_calls", port, f"{tag}-decoy", addr)
                assert busy.stdout.readline().strip() == "ready"
                busy.stdin.write("go\n" * 20)   # its rounds run while the watched one's do
                busy.stdin.flush()
        # Redis names its process "redis-server <address>:<port>": the address tells the two apart
        yield ServiceSpec("cache", cmdline=f"^redis-server {re.escape(watched)}:{port}"), watched, port
    finally:
        for m in made:
            if isinstance(m, subprocess.Popen):
                m.kill()
                m.wait(timeout=10)
            else:
                remove_namespace(m)


def test_commands_classed_counted_and_timed_against_redis_own_account(kernel, spawn, tag, cache):
    spec, host, redis_port = cache
    collector = kernel([spec, ServiceSpec("app", cmdline=f"redis_calls.py {redis_port} {tag} ")], FAMILIES)
    client = spawn("redis_calls", redis_port, tag, host)
    assert client.stdout.readline().strip() == "ready"
    r = redis.Redis(host=host, port=redis_port)
    r.ping()                                 # connected (and redis-py's CLIENT SETINFO sent) before the first window
    collector.refresh()
    collected(collector)
    for _ in range(2):
        before, errors_before = r.info("commandstats"), r.info("stats")["total_error_replies"]
        r.slowlog_reset()
        client.stdin.write("go\n")
        client.stdin.flush()
        clock = json.loads(client.stdout.readline())
        after, errors_after = r.info("commandstats"), r.info("stats")["total_error_replies"]
        slow = [entry for entry in r.slowlog_get() if entry["command"].startswith(b"EVAL")]
        samples = collected(collector)
        app = samples.get("app")
        assert app is None or not any(fam.startswith("redis_") for fam, _ in [*app.histograms, *app.counters]), \
            "the client's own connection was taken for a server's"
        cache = samples["cache"]
        redis_says = calls(before, after)
        redis_says["other"] = (redis_says["other"][0] + OWN_AFTER, redis_says["other"][1])
        kernel_says = {cls: cache.histograms.get((REDIS_COMMAND, cls)) for cls in CLASSES}
        for cls in CLASSES:
            h = kernel_says[cls]
            record("redis commands by class", f"{cls} commands against INFO commandstats",
                   h.count if h else 0, redis_says[cls][0], "commands", "exact")
            assert (h.count if h else 0) == redis_says[cls][0], (cls, redis_says)
        assert cache.counters.get((REDIS_ARRIVED, "")) == sum(n for n, _ in redis_says.values())
        assert redis_says["read"][0] == SINGLE + PIPELINED and redis_says["blocking"][0] == 1
        assert cache.counters.get((REDIS_ERRORS, ""), 0) == errors_after - errors_before == 1
        # each class's summed time: at least what Redis spent running it, at most the client's clock
        # (the 50 pipelined GETs share one time, the batch's, which the client's pipeline time holds)
        ceiling = {"read": sum(clock["get"]) + PIPELINED * clock["pipeline"],
                   "write": sum(clock["set"]) + clock["big"] + clock["incr"],
                   "blocking": clock["blpop"]}
        for cls, top in ceiling.items():
            total_s, floor_s = kernel_says[cls].total_ns / 1e9, redis_says[cls][1] / 1e6
            record("redis command time", f"{cls}: Redis's own usec <= kernel <= client clock", total_s,
                   top, "s", "within")
            assert floor_s <= total_s <= top, (cls, floor_s, total_s, top)
        assert BLOCK_S <= kernel_says["blocking"].total_ns / 1e9
        # the script that keeps Redis busy SPIN_MS: SLOWLOG's own duration <= the kernel's <= the client's
        spin_s = slow[0]["duration"] / 1e6
        assert SPIN_MS / 1e3 <= spin_s
        other = kernel_says["other"]
        low, high = (b / 1e9 for b in slot_bounds(other.hi - 1))   # the slowest one's slot (~9 % wide)
        record("redis command time", "a 30 ms script against SLOWLOG", (low + high) / 2, spin_s, "s", "within")
        assert other.kept[-1] == 1 and spin_s < high and low <= clock["spin"], (spin_s, low, high, clock["spin"])
