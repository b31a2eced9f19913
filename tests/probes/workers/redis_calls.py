"""A Redis client for tests/probes/test_redis.py: on each "go" line it runs one round
against the Redis at argv[1] and prints its own clock's times as one JSON line:
GETs and SETs one at a time, a pipeline of GETs sent in one write, a large SET that
crosses many reads, a command that fails, a Lua script that keeps Redis busy for
SPIN_MS, and a BLPOP that waits BLOCK_S on an empty list. argv[2]: a tag only, so
that the test can find this process by its command line; argv[3]: Redis's address
(127.0.0.1 by default)."""
import json
import sys
import time

import redis

SINGLE, PIPELINED, BIG_BYTES, SPIN_MS, BLOCK_S = 30, 20, 200_000, 30, 0.1
SPIN = """local t = redis.call('TIME')
local stop = tonumber(t[1]) * 1000000 + tonumber(t[2]) + tonumber(ARGV[1]) * 1000
repeat t = redis.call('TIME') until tonumber(t[1]) * 1000000 + tonumber(t[2]) >= stop
return 1"""


def timed(fn, *args):
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def main():
    r = redis.Redis(host=sys.argv[3] if len(sys.argv) > 3 else "127.0.0.1", port=int(sys.argv[1]))
    r.set("text", "hello")
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() != "go":
            break
        out = {"get": [timed(r.get, "text") for _ in range(SINGLE)],
               "set": [timed(r.set, f"k{i}", i) for i in range(SINGLE)]}
        pipe = r.pipeline(transaction=False)
        for i in range(PIPELINED):
            pipe.get(f"k{i % SINGLE}")
        out["pipeline"] = timed(pipe.execute)
        out["big"] = timed(r.set, "big", b"x" * BIG_BYTES)
        t0 = time.perf_counter()
        try:
            r.incr("text")                   # not an integer: an error reply
        except redis.ResponseError:
            out["incr"] = time.perf_counter() - t0
        out["spin"] = timed(r.eval, SPIN, 0, SPIN_MS)
        out["blpop"] = timed(r.blpop, ["empty"], BLOCK_S)
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
