"""Servers that speak a protocol of their own, not HTTP, known by their program and
their usual port: `slotune discover` never sends them an HTTP request (they log one as
an attack), and a service the config finds as one of them is said at start to have no
request slotune can time, unless a probe family times its protocol
(daemon/attribution/timeable.py)."""
from __future__ import annotations

import re
from typing import NamedTuple


class Server(NamedTuple):
    protocol: str                # as its users name it
    programs: tuple[str, ...]    # its process names
    port: int                    # the port it listens on unless told otherwise


SERVERS = {
    "redis": Server("Redis", ("redis-server",), 6379),
    "postgres": Server("PostgreSQL", ("postgres",), 5432),
    "mysql": Server("MySQL", ("mysqld", "mariadbd"), 3306),
    "memcached": Server("memcached", ("memcached",), 11211),
    "ssh": Server("SSH", ("sshd",), 22),
}
BY_PROGRAM = {program: name for name, s in SERVERS.items() for program in s.programs}
HTTP = "HTTP/1"      # what a service not found as one of them is taken to speak


def found_as(port: int | None, cmdline: str | None) -> tuple[Server, str] | None:
    """(the server, how the config finds it) when a service's port is one's usual port or
    its command-line pattern names one's program as a word (`postgres`, not `postgres_exporter`);
    else None."""
    for s in SERVERS.values():
        if port == s.port:
            return s, f"port {port}"
        for program in s.programs:
            if cmdline and re.search(rf"(?<![\w-]){re.escape(program)}(?![\w-])", cmdline):
                return s, f"cmdline {program}"
    return None
