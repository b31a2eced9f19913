"""Redis (RESP2, RESP3) per service from a Redis server's own sockets (bpf/redis.bpf.c):
each command's time from the read that brought it to its reply's write, by command
class, the commands as they arrive and the error replies. A watched Redis, valkey or
KeyDB server is then timed like an HTTP one: its latency, its load, a downstream cause
of the services that call it."""
import ctypes

from slotune.collectors.kernel import sockets
from slotune.collectors.kernel.family import Family, Map, Signal
from slotune.collectors.kernel.helpers import PT_REGS
from slotune.model import servers
from slotune.model.signals import REDIS_ARRIVED, REDIS_BLOCKING, REDIS_COMMAND, REDIS_ERRORS

CLASSES = ("read", "write", REDIS_BLOCKING, "other")     # label id: the index
NAME_BYTES = 8          # a command name's bytes the kernel compares (REDIS_NAME)
# Commands by class; any other is "other" (PING, AUTH, INFO, MULTI, EVAL...). "blocking"
# ones wait for someone else (a push, a publisher, replicas), so their time is not Redis's;
# so do a replica's own (REPLCONF ACK gets no reply: the next write of the feed ends it).
COMMANDS = {
    "read": "GET MGET GETRANGE STRLEN EXISTS TTL PTTL TYPE GETBIT BITCOUNT BITPOS HGET HMGET HGETALL "
            "HKEYS HVALS HLEN HEXISTS HSTRLEN HRANDFIELD LRANGE LLEN LINDEX LPOS SMEMBERS SISMEMBER "
            "SMISMEMBER SCARD SRANDMEMBER SINTER SUNION SDIFF ZRANGE ZRANGEBYSCORE ZRANGEBYLEX ZREVRANGE "
            "ZREVRANGEBYSCORE ZSCORE ZMSCORE ZCARD ZRANK ZREVRANK ZCOUNT ZLEXCOUNT SCAN HSCAN SSCAN ZSCAN "
            "KEYS XRANGE XREVRANGE XLEN PFCOUNT DBSIZE RANDOMKEY GEOPOS GEODIST GEOSEARCH",
    "write": "SET SETEX PSETEX SETNX SETRANGE MSET MSETNX GETSET GETDEL GETEX APPEND INCR INCRBY "
             "INCRBYFLOAT DECR DECRBY DEL UNLINK EXPIRE PEXPIRE EXPIREAT PEXPIREAT PERSIST RENAME COPY "
             "HSET HSETNX HMSET HINCRBY HINCRBYFLOAT HDEL LPUSH RPUSH LPUSHX RPUSHX LPOP RPOP LSET LTRIM "
             "LREM LINSERT LMOVE SADD SREM SPOP SMOVE ZADD ZREM ZINCRBY ZPOPMIN ZPOPMAX ZREMRANGEBYSCORE "
             "XADD XACK XDEL XTRIM XCLAIM XAUTOCLAIM SETBIT PFADD PFMERGE GEOADD PUBLISH FLUSHDB FLUSHALL",
    "blocking": "BLPOP BRPOP BLMOVE BRPOPLPUSH BLMPOP BZPOPMIN BZPOPMAX BZMPOP XREAD XREADGROUP WAIT "
                "WAITAOF SUBSCRIBE PSUBSCRIBE SSUBSCRIBE MONITOR REPLCONF PSYNC SYNC",
}


def name_key(name: str) -> int:
    """A command's key in redis_commands: its first NAME_BYTES bytes, zero-padded, read as a
    little-endian u64 with bit 5 of each byte cleared (upper case, for letters), as
    bpf/redis.bpf.c reads them."""
    return int.from_bytes(name.encode()[:NAME_BYTES].ljust(NAME_BYTES, b"\0"), "little") & 0xDFDFDFDFDFDFDFDF


def command_keys() -> dict[int, int]:
    """Every listed command's key -> its class id. Two names that share their first
    NAME_BYTES bytes must share a class (ZREVRANGE, ZREVRANGEBYSCORE)."""
    out: dict[int, int] = {}
    for cls, names in COMMANDS.items():
        for name in names.split():
            key, cid = name_key(name), CLASSES.index(cls)
            if out.setdefault(key, cid) != cid:
                raise ValueError(f"redis command {name}: its first {NAME_BYTES} bytes name another class")
    return out


class Redis(Family):
    name = source = "redis"
    times = (servers.SERVERS["redis"].protocol,)
    signals = (Signal(REDIS_COMMAND, "slotune_redis_command_duration_seconds", "command_class", "histogram",
                      "Redis command latency seen from the kernel: the read that brought the command to the "
                      "first write after it (its reply; commands read together share their batch's time)"),
               Signal(REDIS_ERRORS, "slotune_redis_errors_total", None, "counter",
                      "Redis error replies (-ERR, RESP3 !), read from the first reply of each batch"),
               Signal(REDIS_ARRIVED, "slotune_redis_commands_arrived_total", None, "counter",
                      "Redis commands read by the server, counted as they arrive (answered or not yet)"))
    raw_tracepoints = sockets.POINTS
    hooks = (("sock_received", "redis_sock_received"), ("sock_sent", "redis_sock_sent"),
             ("sock_ended", "redis_sock_ended"))
    claims = ("sock_received", "sock_sent")   # a Redis server's connection is its alone
    helpers = PT_REGS
    defines = {"REDIS_CLASSES": len(CLASSES), "REDIS_OTHER": CLASSES.index("other"), "REDIS_COMMAND_NAMES": 256}
    maps = {"redis_conns": Map(65536, True, "an evicted connection's batch waiting for its reply is not timed, "
                                            "and its next bytes are read afresh")}

    def __init__(self):
        self.defines = {**self.defines, **sockets.layout()}
        self.raw_tracepoints = sockets.points()
        self.tracepoints = sockets.syscall_points()
        self.filled = False

    def refresh(self, program, targets, service_ids) -> None:
        """The command classes into redis_commands, once."""
        if not self.filled:
            table = program.table("redis_commands")
            for key, cls in command_keys().items():
                table[table.Key(key)] = ctypes.c_uint8(cls)
            self.filled = True

    def label(self, signal: str, label_id: int, service: str) -> str:
        return CLASSES[label_id] if signal == REDIS_COMMAND and label_id < len(CLASSES) else ""
