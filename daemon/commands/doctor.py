"""`slotune doctor`: one line per host check, ✓ or ✗, and the fix for each ✗.
Exit 0 when the daemon can run (possibly degraded), 1 when it cannot."""
from __future__ import annotations

import socket
from urllib.parse import urlparse
from urllib.request import urlopen

from slotune import config
from slotune.collectors.kernel import sockets
from slotune.collectors.kernel.families import FAMILIES
from slotune.collectors.kernel.helpers import missing
from slotune.host import kernel_features as kf

NAME = "doctor"
HELP = "check this host: privileges, BTF, tracefs, BCC, probe kinds, headers, NVML, Prometheus, Redis"
EXAMPLES = """  slotune doctor
  slotune doctor --config /etc/slotune/slotune.toml     # also validates it and checks its Prometheus
  slotune doctor --prometheus-url http://127.0.0.1:9090 --redis-url redis://127.0.0.1:6379
  sudo slotune doctor || journalctl -u slotune   # exit 1 means the daemon cannot run
"""


def add_arguments(parser) -> None:
    parser.add_argument("--config", help="also check what this daemon config names (its prometheus_url); "
                                         "default /etc/slotune/slotune.toml when it exists")
    parser.add_argument("--prometheus-url", help="also check that this Prometheus answers /-/ready")
    parser.add_argument("--redis-url", help="also check that this Redis answers PING")


def configured_prometheus(args) -> tuple[str | None, kf.Finding | None]:
    """The Prometheus URL to check: the flag, else the config's daemon.prometheus_url."""
    if args.prometheus_url:
        return args.prometheus_url, None
    path = args.config or (str(config.DEFAULT_PATH) if config.DEFAULT_PATH.exists() else None)
    if path is None:
        return None, None
    try:
        return config.load(path).prometheus_url or None, kf.Finding("config", True, f"{path} is valid")
    except config.ConfigError as exc:
        return None, kf.Finding("config", False, str(exc), "fix that key (slotune.example.toml documents each)",
                                required=True)


def check_prometheus(url: str) -> kf.Finding:
    try:
        with urlopen(url.rstrip("/") + "/-/ready", timeout=3) as resp:
            return kf.Finding("Prometheus", True, f"{url} ready (HTTP {resp.status})")
    except Exception as exc:
        return kf.Finding("Prometheus", False, f"{url} not reachable: {exc}",
                          "start Prometheus or fix the URL; slotune keeps its own baseline store meanwhile")


def check_redis(url: str) -> kf.Finding:
    parsed = urlparse(url)
    host, port = parsed.hostname or "127.0.0.1", parsed.port or 6379
    try:
        with socket.create_connection((host, port), timeout=3) as conn:
            conn.sendall(b"PING\r\n")
            reply = conn.recv(64)
        if reply.startswith((b"+PONG", b"-NOAUTH")):
            return kf.Finding("Redis", True, f"{host}:{port} answers PING")
        return kf.Finding("Redis", False, f"{host}:{port} answered {reply[:40]!r}", "check the URL points at Redis")
    except OSError as exc:
        return kf.Finding("Redis", False, f"{host}:{port} not reachable: {exc}",
                          "start redis-server or fix the URL (the reference stack's caches need it)")


def check_families() -> list[kf.Finding]:
    """A line per probe family that calls BPF helpers beyond Linux 5.11: the collector's own
    start-up check (helpers.py), so both say the same."""
    found = []
    for name, family in FAMILIES.items():
        if not family.helpers:
            continue
        why = missing(family)
        if why:
            found.append(kf.Finding(f"{name} probes", False, *why))
        else:
            found.append(kf.Finding(f"{name} probes", True,
                                    f"BPF helpers {', '.join(h.name for h in family.helpers)} present"))
    return found


def check_nvml() -> kf.Finding:
    from slotune.collectors.gpu import collector as nvml  # the collector's own start-up check, so both say the same
    ok, detail, fix = nvml.probe()
    return kf.Finding("NVML", ok, detail, fix)


def check_socket_layer() -> kf.Finding:
    """Where the http and tls probes read sockets: the collector's own choice (sockets.py)."""
    offset, why = sockets.protocol_offset()
    if offset >= 0:
        return kf.Finding("socket probes", True, "http and tls read the socket layer's tracepoints: "
                                                 "no program on any syscall")
    return kf.Finding("socket probes", False, f"{why}; http and tls: {sockets.FALLBACK}", sockets.FIX)


def findings(args) -> list[kf.Finding]:
    found = [kf.check_privileges(), kf.check_btf(), kf.check_tracefs(), kf.check_headers(),
             kf.check_memlock()]
    if found[0].ok and found[2].ok:
        found += [kf.check_bcc_tracepoint(), kf.check_raw_tracepoint(), kf.check_uprobe(),
                  kf.check_kprobe(), kf.check_fentry(), *check_families(), check_socket_layer()]
    else:
        found.append(kf.Finding("probes", False, "not tried: needs privileges and tracefs first",
                                "fix the lines above, then run slotune doctor again", required=True))
    found.append(check_nvml())
    prometheus_url, config_finding = configured_prometheus(args)
    if config_finding:
        found.append(config_finding)
    if prometheus_url:
        found.append(check_prometheus(prometheus_url))
    if args.redis_url:
        found.append(check_redis(args.redis_url))
    return found


def render(finding: kf.Finding) -> str:
    line = f"{'✓' if finding.ok else '✗'} {finding.name:<15} {finding.detail}"
    if not finding.ok and finding.fix:
        line += f"\n  {'':<15} fix: {finding.fix}"
    return line


def run(args) -> int:
    found = findings(args)
    for finding in found:
        print(render(finding), flush=True)
    fatal = [f.name for f in found if f.required and not f.ok]
    if fatal:
        print(f"\nthe daemon cannot run: {', '.join(fatal)} failed")
        return 1
    degraded = [f.name for f in found if not f.ok]
    print("\nthe daemon can run" + (f", degraded: {', '.join(degraded)} unavailable" if degraded else ""))
    return 0
