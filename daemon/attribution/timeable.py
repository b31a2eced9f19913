"""Which services' requests slotune can never time, decided from the config at start,
and what would make them timeable. A service's requests are timed by its own latency
histogram (metrics_url), or by a probe family that times its protocol (a family's
`times`: the http family, HTTP/1). A service the config finds as a server of another
protocol (model/servers.py: port 6379, or `redis-server` in its cmdline), or any service
without a latency of its own while no family times HTTP/1, is never timed: it cannot be
a downstream cause. The daemon says so at start, one line per `downstream` naming it, and
its explanation says so instead of "warming up"."""
from __future__ import annotations

from typing import Collection

from slotune import profiles
from slotune.model import servers

LATENCY_SIGNALS = ("request_duration_seconds", "request_duration_mean_seconds")   # a profile's latency


def own_latency(spec) -> bool:
    """Whether the service's own metrics give its latency (latency_metric, or its profile's)."""
    return bool(spec.metrics_url and (spec.latency_metric or any(
        sig in profiles.get(spec.profile).signals for sig in LATENCY_SIGNALS)))


def untimeable(services, timed: Collection[str]) -> dict[str, str]:
    """service -> why its requests can never be timed and what would make them timeable;
    timed: the protocols the probe families turned on time."""
    out = {}
    for s in services:
        if own_latency(s.spec):
            continue
        fix = f"to time it, give {s.name} a metrics_url with its latency histogram (latency_metric)"
        found = servers.found_as(s.spec.port, s.spec.cmdline)
        if found is not None and found[0].protocol not in timed:
            server, how = found
            out[s.name] = (f"found by {how}, it is a {server.protocol} server, and no probe family of slotune "
                           f"times {server.protocol} requests; {fix}")
        elif found is None and servers.HTTP not in timed:
            out[s.name] = (f"no probe family that times {servers.HTTP} is on (daemon.probes) and it has no latency "
                           f"of its own; {fix}, or turn on the http family if it speaks {servers.HTTP}")
    return out


def downstream_lines(services, never: dict[str, str]) -> list[str]:
    """One line per `downstream` that can never be timed (never: untimeable's answer)."""
    return [f"service {s.name}: downstream {dep} cannot be timed, so it is never named as {s.name}'s cause: "
            f"{never[dep]}, or remove it from {s.name}'s downstream" for s in services for dep in s.downstream
            if dep in never]
