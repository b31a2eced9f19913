"""A service as users declare it: a name, how to find its processes, its SLO,
and (for the control loop) where its settings live."""
from __future__ import annotations

import pwd
from dataclasses import dataclass, field
from urllib.parse import urlsplit

MAX_UID = 2**32 - 2          # (uid_t)-1 means "no uid"


@dataclass(frozen=True)
class ServiceSpec:
    name: str
    # Any of these finds the service's processes (all given ones must match). Another local
    # user cannot spoof systemd_unit, cgroup or user: joining a cgroup takes write access to
    # it and changing uid takes privilege. They can spoof cmdline (anyone may start a process
    # with any command line) and, to some degree, port (anyone may listen on a port >= 1024
    # while the service does not hold it, e.g. as it restarts).
    systemd_unit: str | None = None
    cgroup: str | None = None            # path under /sys/fs/cgroup
    cmdline: str | None = None           # regular expression over the command line's first 4 KiB
    port: int | None = None              # a TCP port the service listens on
    user: str | int | None = None        # the account (name or uid) its processes run as
    metrics_url: str = ""                # its own Prometheus /metrics, when it has one
    profile: str = "reference"           # what its metrics and settings mean (daemon/profiles)
    latency_metric: str = ""             # its e2e latency histogram family in metrics_url
    slo_p99_s: float = 0.5
    # Token-level objectives of a service that streams tokens (0: not declared): time to
    # the first token and time per output token, each at P99, and where the service's own
    # metrics time them (histogram families in metrics_url; else the kernel's http timing).
    slo_ttft_p99_s: float = 0.0
    slo_tpot_p99_s: float = 0.0
    ttft_metric: str = ""
    tpot_metric: str = ""
    # Remote ports that name peers, e.g. {8000: "inference"}; others count as "other".
    peers: dict[int, str] = field(default_factory=dict)
    # Paths of requests the http family neither counts nor times (health checks, an exporter's).
    untimed_paths: tuple[str, ...] = ()
    # Path prefixes of its routes (model/routes.py): its HTTP series are labelled by the first
    # that starts a request's path, or "other"; it is judged on its routes' requests alone.
    routes: tuple[str, ...] = ()

    def untimed(self) -> tuple[str, ...]:
        """untimed_paths and the path of its own metrics_url: read each second by slotune
        and by Prometheus, those requests are no load of the service's users."""
        own = urlsplit(self.metrics_url).path if self.metrics_url else ""
        return tuple(dict.fromkeys((*self.untimed_paths, *([own] if own else []))))

    def own_metrics(self) -> tuple[str, ...]:
        """The families of its metrics it names itself (latency_metric, ttft_metric, tpot_metric)."""
        return tuple(f for f in (self.latency_metric, self.ttft_metric, self.tpot_metric) if f)

    def uid(self) -> int | None:
        """The uid `user` names (None when not given); ValueError, saying the fix, when it names none."""
        if self.user is None:
            return None
        if isinstance(self.user, int) and not isinstance(self.user, bool):
            if not 0 <= self.user <= MAX_UID:
                raise ValueError(f"user {self.user} is not a uid (0..{MAX_UID})")
            return self.user
        if not isinstance(self.user, str):
            raise ValueError(f"user must be an account name or a numeric uid, got {self.user!r}")
        try:
            return pwd.getpwnam(self.user).pw_uid
        except KeyError:
            raise ValueError(f"user {self.user!r} has no account on this host: create it, "
                             "or give its numeric uid") from None

    def __hash__(self) -> int:
        return hash(self.name)
