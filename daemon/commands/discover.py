"""`slotune discover`: the host's listening TCP services (process, port, network
namespace), what slotune recognises of each (a /metrics or stub_status page that
matches a profile, probed over loopback with a short timeout, or a known process
name), the probe families that will see it, and a starter slotune.toml for the
ones picked, which `slotune run` loads as it is. For a product whose own config
says where its limits are set (HAProxy's stats socket and servers), that config
is read and the service's control, throttle and bounds are written whole. What a
process, a config or a /metrics page says is hostile: each value copied from one is
written as an escaped TOML string (or left out), each comment and table cell as one
line of printable ASCII."""
from __future__ import annotations

import http.client
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from slotune import config, profiles
from slotune.collectors.kernel.targeting import command_line, listening_rows, netns_of, socket_inodes
from slotune.collectors.service_metrics import parse_stub_status
from slotune.profiles.haproxy import target_error
from slotune.host.http_exchange import exchange
from slotune.model import servers
from slotune.profiles import haproxy_config

NAME = "discover"
HELP = "list this host's listening services, what slotune recognises of each, and write a starter config"
EXAMPLES = """  slotune discover                               # the table, then a starter config for what it recognised
  slotune discover --pick vllm,haproxy --write /etc/slotune/slotune.toml
  slotune discover --pick 8000,8404 --write slotune.toml   # by port
  slotune discover --pick 8080 --slo-ms 800 --write slotune.toml   # HAProxy's frontend, throttled to P99 800 ms
  slotune discover --timeout 0.5 --no-probe       # names and ports only: nothing is sent to any port
  slotune discover --internal                     # also the loopback ports of a service's own child processes
"""
PROBE_PATHS = ("/metrics", "/stats/prometheus", "/stub_status", "/nginx_status", "/basic_status")
MAX_BYTES = 1 << 20
NOT_HTTP = servers.BY_PROGRAM     # process name -> server that speaks no HTTP: named, never probed
ALWAYS = ("runqueue", "offcpu", "tcp", "exec")    # the probe families that see any process by its port
# profile -> how its own config names the concurrency limit of a port: (pid, port) -> (Admission | None, hints)
OWN_CONFIG = {"haproxy": haproxy_config.admission_of}
ADMISSION = "concurrency_limit"       # the setting an Admission is


@dataclass
class Listener:
    port: int
    netns: int
    pid: int
    process: str
    cmdline: str
    profile: str = ""
    metrics_url: str = ""
    speaks_http: bool = False
    series: list[tuple[str, dict]] = field(default_factory=list)   # (family, labels) of its metrics
    called: str = ""     # what its own metrics call it
    name: str = ""
    admission: haproxy_config.Admission | None = None    # where its concurrency limit is set, from its own config
    hints: list[str] = field(default_factory=list)       # what of its own config could not be read, and why
    loopback_only: bool = False    # every socket listening on this port is bound to a loopback address

    @property
    def probes(self) -> tuple[str, ...]:
        return ALWAYS + (("http",) if self.speaks_http else ())


def add_arguments(parser) -> None:
    parser.add_argument("--pick", default="", help="comma-separated names or ports from the table to write a "
                                                   "config for (default: every service slotune recognised)")
    parser.add_argument("--write", metavar="FILE", help="write the starter config there (refused if it exists), "
                                                        "instead of printing it")
    parser.add_argument("--timeout", type=float, default=0.5, help="seconds per probe of a port (default 0.5)")
    parser.add_argument("--no-probe", action="store_true", help="send nothing to any port: names and ports only")
    parser.add_argument("--internal", action="store_true",
                        help="also probe and list loopback-only ports of a recognised service's child processes "
                             "(an engine's workers: vLLM's, Ray's), which are left out by default")
    parser.add_argument("--metrics-path", action="append", default=[], metavar="PATH",
                        help=f"also probe this path (probed: {', '.join(PROBE_PATHS)}); e.g. where haproxy.cfg "
                             "serves its prometheus-exporter")
    parser.add_argument("--slo-ms", type=float, default=500.0, metavar="MS",
                        help="the P99 latency objective written for each service, in ms (default 500)")
    parser.add_argument("--slo-ttft-ms", type=float, default=0.0, metavar="MS",
                        help="the P99 time-to-first-token objective written for each token-streaming service "
                             "(default: left as a comment)")
    parser.add_argument("--slo-tpot-ms", type=float, default=0.0, metavar="MS",
                        help="the P99 time-per-output-token objective, likewise")
    parser.add_argument("--budget", type=float, default=10.0, metavar="S",
                        help="seconds for probing all ports together (default 10): ports left when it is spent "
                             "are named by their process only")


def listeners() -> list[Listener]:
    """One per (network namespace, port): the process that listens there with the lowest pid (the master)."""
    found: dict[tuple[int, int], Listener] = {}
    tables: dict[int, dict[int, int]] = {}
    loopback: dict[int, set[int]] = {}
    for entry in sorted((int(p) for p in os.listdir("/proc") if p.isdigit())):
        netns = netns_of(entry)
        if netns is None or entry == os.getpid():
            continue
        if netns not in tables:      # the namespace's listening sockets, read once
            rows = listening_rows(f"/proc/{entry}/net")
            tables[netns], loopback[netns] = {inode: port for inode, _, port in rows}, loopback_ports(rows)
        table = tables[netns]
        for inode in socket_inodes(entry) & table.keys():
            key = (netns, table[inode])
            if key not in found:
                found[key] = Listener(table[inode], netns, entry, _comm(entry), command_line(entry),
                                      loopback_only=table[inode] in loopback[netns])
    return sorted(found.values(), key=lambda listener: (listener.netns != netns_of(os.getpid()), listener.port))


LOOPBACK = re.compile(r"[0-9A-F]{6}7F|0{24}01000000|0{16}FFFF0000[0-9A-F]{6}7F")   # 127/8, ::1, ::ffff:127/104


def loopback_ports(rows: list[tuple[int, str, int]]) -> set[int]:
    """Ports of a namespace's listening_rows whose every socket is bound to a loopback address
    (the kernel writes an address as 32-bit words in host order, hex)."""
    addresses: dict[int, set[bool]] = {}
    for _, address, port in rows:
        addresses.setdefault(port, set()).add(bool(LOOPBACK.fullmatch(address.upper())))
    return {port for port, kinds in addresses.items() if kinds == {True}}


def parent_of(pid: int) -> int:
    """The process's parent (0 where it is gone or unreadable)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_bytes().rpartition(b")")[2].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def ancestors(pid: int) -> list[int]:
    out, seen = [], {pid}
    while (pid := parent_of(pid)) > 1 and pid not in seen:
        out.append(pid)
        seen.add(pid)
    return out


def internal_to(listener: Listener, found: list[Listener], above: set[int]) -> Listener | None:
    """The recognised service whose own child process listens here on loopback only (an
    engine's workers: vLLM's talk to its API server on ports nobody else calls), if any."""
    if not listener.loopback_only:
        return None
    return next((s for s in found if s.metrics_url and s.pid in above and s.netns == listener.netns), None)


def _comm(pid: int) -> str:
    """The process's name, as it set it (any bytes but NUL; not UTF-8 is read as U+FFFD)."""
    try:
        return Path(f"/proc/{pid}/comm").read_bytes().decode(errors="replace").strip()
    except OSError:
        return "?"


def probe(listener: Listener, timeout_s: float, paths=PROBE_PATHS) -> None:
    """Fill in what the listener's metrics say it is: GET each path over loopback until one
    matches a profile; else what its process name says. A page of another product than
    the process's own (a proxy passing /metrics on to its engine) is not taken as its."""
    named = by_process(listener)
    for path in paths:
        url = f"http://127.0.0.1:{listener.port}{path}"
        try:
            status, _, body = exchange(url, headers={"Accept": "text/plain"}, timeout_s=timeout_s, max_bytes=MAX_BYTES)
        except (OSError, ValueError, http.client.HTTPException):   # no answer, or not HTTP
            if not listener.speaks_http:
                break          # it does not speak HTTP: no other path will do better
            continue
        listener.speaks_http = True
        profile = recognise(body.decode(errors="replace")) if status == 200 else None
        if profile is not None and (named is None or named is profile):
            listener.profile, listener.metrics_url = profile.name, url
            listener.series = _series(body.decode(errors="replace"), profile)
            listener.called = next((m.group(1) for mark in profile.marks for fam, _ in listener.series
                                    if (m := re.fullmatch(mark, fam)) and m.groups()), "")
            return
    if named is not None:
        listener.profile = named.name


def recognise(text: str) -> profiles.Profile | None:
    """The profile whose marks the page's families carry (or nginx's, for a stub_status page)."""
    try:
        parse_stub_status(text)
        return profiles.get("nginx")
    except ValueError:
        pass
    try:
        names = {f.name for f in text_string_to_metric_families(text)}
    except Exception:    # not Prometheus text: nothing slotune reads
        return None
    for p in profiles.every():
        if any(re.fullmatch(mark, n) for mark in p.marks for n in names):
            return p
    return None


def by_process(listener: Listener) -> profiles.Profile | None:
    words = set(re.split(r"[\s/=.]+", listener.cmdline)) | {listener.process}   # python -m vllm.entrypoints...
    return next((p for p in profiles.every() if any(name in words or name == listener.process
                                                     for name in p.processes)), None)


def _series(text: str, profile: profiles.Profile) -> list[tuple[str, dict]]:
    if profile.exposition != "prometheus":
        return []
    return [(s.name, s.labels) for f in text_string_to_metric_families(text) for s in f.samples]


def name_them(found: list[Listener]) -> None:
    """Each a service name in the users' words: what its metrics call it, its profile, else its
    process; with its port (and network namespace) after it when another has the same."""
    bases = [re.sub(r"[^a-z0-9_-]+", "-", (s.called or s.profile or NOT_HTTP.get(s.process, s.process)).lower())
             or "svc" for s in found]
    ports: dict[tuple[str, int], list[Listener]] = {}
    for s, base in zip(found, bases):
        ports.setdefault((base, s.port), []).append(s)
    for s, base in zip(found, bases):
        if bases.count(base) == 1:
            s.name = base
        elif len(ports[(base, s.port)]) == 1:
            s.name = f"{base}-{s.port}"
        else:
            s.name = f"{base}-{s.port}-{s.netns}"
    _one_each(found)


def _one_each(found: list[Listener]) -> None:
    """A name an earlier row already has gets a number after it: a process may call itself
    what another row is named (`redis-6379`), and two [services.NAME] tables would not load."""
    seen = set()
    for s in found:
        name, n = s.name, 1
        while name in seen:
            n += 1
            name = f"{s.name}-{n}"
        seen.add(name)
        s.name = name


def table(found: list[Listener]) -> str:
    own = netns_of(os.getpid())
    rows = [("NAME", "PROCESS", "PORT", "NETNS", "PROFILE", "METRICS", "PROBES")]
    for s in found:
        rows.append((s.name, f"{printable(s.process)}[{s.pid}]", str(s.port),
                     "host" if s.netns == own else str(s.netns), s.profile or "-", s.metrics_url or "-",
                     ",".join(s.probes)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def printable(text: str) -> str:
    """text as one line of printable ASCII, any other character as its TOML escape (\\u001B):
    a comment or a table cell that a process's name, a config's path or a label fills can
    neither end its line, nor send a terminal escape, nor hide behind a look-alike letter."""
    return "".join(c if " " <= c <= "~" else f"\\u{ord(c):04X}" if ord(c) <= 0xFFFF else f"\\U{ord(c):08X}"
                   for c in text)


def toml_string(value: str) -> str:
    """value as a TOML basic string of printable ASCII, which reads back exactly (tomllib):
    safe in a comment too, and right when that line is uncommented."""
    if _not_utf8(value):
        raise ValueError(f"{printable(value)} is not UTF-8 text")
    return '"' + printable(value.replace("\\", "\\\\").replace('"', '\\"')) + '"'


def _not_utf8(text: str) -> bool:
    """Whether text holds bytes that were not UTF-8 (read as lone surrogates), which no TOML string holds."""
    return any("\ud800" <= c <= "\udfff" for c in text)


def starter(picked: list[Listener], slo_ms: float = 500.0, token_slos_ms: dict[str, float] | None = None) -> str:
    """A slotune.toml that `slotune run` accepts as it is: each service found by its port,
    read through its profile, with its P99 objective; tuned by the throttle where its own
    config says where its concurrency limit is set, else how to let slotune tune it is
    left in comments. token_slos_ms: {"ttft": ms, "tpot": ms} written for the profiles
    that stream tokens; an objective not given is left as a comment."""
    token_slos_ms = token_slos_ms or {}
    out = ["# Written by `slotune discover`. Each service is found by its port: anyone may listen",
           "# there while it is down, so add systemd_unit or cgroup (README, Safety). Keys: docs/daemon.md;",
           "# what slotune reads of each profile and can push: docs/targets.md.", ""]
    for s in picked:
        p = profiles.get(s.profile) if s.profile else None
        out += [f"[services.{s.name}]", f"port = {s.port}"]
        if s.profile:
            out.append(f"profile = {toml_string(s.profile)}")
        if s.metrics_url:
            out.append(f"metrics_url = {toml_string(s.metrics_url)}")
        if p is not None and p.routes:
            out.append(f"routes = [{', '.join(toml_string(r) for r in p.routes)}]    # judged on these paths alone")
        out += [f"{key} = {toml_string(fam)}" for key, fam in _own_families(s, p).items()]
        out.append(f"slo_p99_ms = {slo_ms:g}")
        if p is not None:
            out += [f"{key} = {token_slos_ms[slo]:g}" if token_slos_ms.get(slo) else f"# {key} = {slo_ms:g}"
                    for slo, key in profiles.SLO_KEYS.items() if slo != "p99" and slo in p.slos]
            out += [f"# {printable(s.process)}'s config: {printable(' '.join(hint.split()))}" for hint in s.hints]
            out += _control(s, s.admission, p) if s.admission is not None else _control_hint(s, p)
        out.append("")
    return "\n".join(out)


def _own_families(s: Listener, p: profiles.Profile | None) -> dict[str, str]:
    """latency_metric, ... for a profile that reads them by suffix: the service's family of that suffix."""
    out = {}
    for key, signal in profiles.WINDOW_SIGNALS.items():
        if p is not None and isinstance(p.signals.get(signal), profiles.Suffix):
            fam = next((f.removesuffix("_bucket") for f, _ in s.series if f.endswith(f"_{signal}_bucket")), "")
            if fam:
                out[key] = fam
    return out


def _control(s: Listener, a: haproxy_config.Admission, p: profiles.Profile) -> list[str]:
    """[control], the throttle and the bounds of its concurrency limit, from where its own config sets it."""
    setting = p.setting(ADMISSION)
    assert setting is not None, "a profile with an own-config reader has an admission setting"
    others = [x for x in p.settings or () if x.live and x.name != ADMISSION]
    lines = [f"[services.{s.name}.control]", f"kind = {toml_string(setting.kind)}",
             f"address = {toml_string(a.socket.address)}"]
    if a.socket.level != "admin":
        lines.append(f"# its stats socket is at level {printable(a.socket.level)}: `set maxconn` needs level admin; "
                     "add `level admin` to that `stats socket` line and reload it, or slotune's pushes are refused")
    lines += [f"[services.{s.name}.control.targets]", f"{ADMISSION} = {toml_string(a.target)}",
              *(f"# {x.name} = {toml_string(_filled(x.target, s))}" for x in others),
              f"[services.{s.name}.tuners.throttle]",
              f"[services.{s.name}.settings.{ADMISSION}]",
              "min = 1",
              f"max = {a.in_force}    # as its config gives it: the throttle gives it back when the load drops",
              f"max_step = {max(1, a.in_force // 2)}    # the throttle's largest cut (x0.5) in one step",
              "integer = true"]
    return lines


def _control_hint(s: Listener, p: profiles.Profile) -> list[str]:
    """How to let slotune push this service's settings, as comments to fill in."""
    live = [x for x in p.settings or () if x.live]
    restart = [x for x in p.settings or () if not x.live]
    lines = []
    if live:
        lines += ["# To tune it (docs/targets.md), fill in and uncomment:", f"# [services.{s.name}.control]",
                  f"# kind = {toml_string(live[0].kind)}", *(f"# {line}" for line in p.control),
                  f"# [services.{s.name}.control.targets]"]
        lines += [f"# {x.name} = {toml_string(_filled(x.target, s))}" for x in live]
    if restart:
        lines += ["# Restart-only (slotune recommends them; give in_force in [settings.NAME]): "
                  + ", ".join(f"{x.name} ({x.target})" for x in restart)]
        lines += ["# To throttle it at a proxy in front: admission_by = \"<that proxy's service>\""]
    return lines


def _filled(target: str, s: Listener) -> str:
    """A target form with the names the service's own metrics give (HAProxy's backend/server),
    where they are names HAProxy allows; else the form as it is, to fill in by hand."""
    servers = [labels for fam, labels in s.series if "server" in labels and "proxy" in labels]
    if servers and "BACKEND/SERVER" in target:
        filled = target.replace("BACKEND/SERVER", f"{servers[0]['proxy']}/{servers[0]['server']}")
        return filled if target_error(filled) is None else target
    return target


def _writable(admission: haproxy_config.Admission | None, hints: list[str]):
    """The admission, unless its stats socket's path is not UTF-8 (no TOML string holds it):
    then none, with a hint, and the service is written with its control left to fill in."""
    if admission is None or not _not_utf8(admission.socket.address):
        return admission, hints
    return None, [*hints, f"its stats socket {printable(admission.socket.address)} is not a UTF-8 path, which "
                          "slotune.toml cannot hold: give its address in [control] by hand"]


def _share_metrics(found: list[Listener]) -> None:
    """A port whose own config says its limit is set there, of a process that serves its metrics
    on another port, reads them there (HAProxy's proxying frontend, its exporter on a frontend of its own)."""
    for s in found:
        if s.admission is not None and not s.metrics_url:
            sibling = next((o for o in found if o.pid == s.pid and o.profile == s.profile and o.metrics_url), None)
            if sibling is not None:
                s.metrics_url, s.series = sibling.metrics_url, sibling.series


def run(args) -> int:
    found, own = listeners(), netns_of(os.getpid())
    internal: dict[str, list[Listener]] = {}      # service -> its child processes' loopback ports
    above = {s.pid: set(ancestors(s.pid)) for s in found}      # each process's parents, read once
    deadline, unprobed = time.monotonic() + args.budget, 0
    for listener in sorted(found, key=lambda s: (len(above[s.pid]), s.loopback_only, s.port)):   # parents first
        left_s = deadline - time.monotonic()
        probed = not args.no_probe and listener.netns == own and listener.process not in NOT_HTTP
        if not args.internal and (service := internal_to(listener, found, above[listener.pid])) is not None:
            internal.setdefault(f"{printable(service.process)}[{service.pid}]", []).append(listener)
        elif probed and left_s > 0:
            probe(listener, min(args.timeout, left_s), (*args.metrics_path, *PROBE_PATHS))
        else:
            unprobed += probed
            if (by_name := by_process(listener)) is not None:
                listener.profile = by_name.name
    left_out = {id(s) for ports in internal.values() for s in ports}
    found = [s for s in found if id(s) not in left_out]
    for s in found:
        if s.netns == own and (reader := OWN_CONFIG.get(s.profile)) is not None:
            s.admission, s.hints = _writable(*reader(s.pid, s.port))
    _share_metrics(found)
    name_them(found)
    print(table(found))
    if unprobed:
        print(f"not probed: {unprobed} port(s) left when the {args.budget:g} s budget was spent, named by their "
              "process only; --budget raises it")
    for parent, ports in internal.items():
        print(f"left out: {len(ports)} loopback port(s) of {parent}'s child processes, its own workers' "
              f"({', '.join(str(s.port) for s in sorted(ports, key=lambda s: s.port))}); --internal lists them")
    wanted = [n for n in args.pick.split(",") if n]
    chosen = {n: [s for s in found if n == s.name or n == str(s.port) and s.netns == own] for n in wanted}
    unknown = [n for n, got in chosen.items() if len(got) != 1]
    if unknown:
        print(f"--pick {','.join(unknown)}: not one row of the table above; pick from its NAME column, or "
              "a PORT of this namespace", file=sys.stderr)
        return 2
    picked = [s for s in found if any(s in got for got in chosen.values())] if wanted else \
        [s for s in found if s.profile]
    if not picked:
        print("\nnothing recognised to write a config for: pick services by name or port with --pick", file=sys.stderr)
        return 1
    text = starter(picked, args.slo_ms, {"ttft": args.slo_ttft_ms, "tpot": args.slo_tpot_ms})
    if not args.write:
        print("\n" + text)
        return 0
    path = Path(args.write)
    if path.exists():
        print(f"--write {path}: it exists; remove it or pick another path", file=sys.stderr)
        return 1
    draft = path.with_name(f".{path.name}.discover-{os.getpid()}")
    try:
        draft.write_text(text)
        try:
            config.load(draft)     # what discover writes must load as it is: else nothing is written
        except config.ConfigError as exc:
            raise RuntimeError(f"the config discover made does not load: {exc}") from None
        os.link(draft, path)       # never over a file that appeared meanwhile
    except OSError as exc:
        print(f"--write {path}: {exc.strerror}; check the folder, or pick another path", file=sys.stderr)
        return 1
    finally:
        draft.unlink(missing_ok=True)
    print(f"\nwrote {path}: {len(picked)} service(s); check it with `slotune doctor --config {path}`")
    return 0
