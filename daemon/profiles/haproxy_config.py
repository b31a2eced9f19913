"""What `slotune discover` reads of a running HAProxy's own configuration: its
runtime API (the global section's `stats socket`, with its `level`) and, for one
listening port, the limit to tune: `maxconn server BE/SRV` when the frontend there
passes to one backend of one server, else `maxconn frontend FE`, with the limit
the config gives it. Only the files on the process's command line are read (`-f
FILE|DIR`, `--`, relative to `-C`; /etc/haproxy/haproxy.cfg without one): read
only, never through a link that leaves a named directory, and what cannot be read
becomes a hint, never a failure. Keywords: HAProxy 2.6 configuration manual
(configuration.txt sections 3.1 `stats socket`, 4 proxies, 5.2 `server`) and
management guide section 2 (`-f`, `-C`, `--`), docs.haproxy.org/2.6."""
from __future__ import annotations

import os
import re
import shlex
import stat
from dataclasses import dataclass, field
from pathlib import Path

from slotune.profiles.haproxy import target_error
from slotune.host.safe_files import open_no_links

DEFAULT_FILE = "/etc/haproxy/haproxy.cfg"
MAX_BYTES = 4 << 20
SECTIONS = {"global", "defaults", "frontend", "backend", "listen", "userlist", "peers", "resolvers", "mailers",
            "program", "http-errors", "ring", "cache", "log-forward"}
DEFAULT_LEVEL = "operator"      # the manual's default for a stats socket
INHERITED = ("maxconn", "default_backend", "server_maxconn")    # what a proxy takes from its defaults section


class Unknown(Exception):
    """What the configuration does not say, in a sentence for a hint line."""


@dataclass(frozen=True)
class StatsSocket:
    address: str     # as the haproxy actuator takes it: a Unix socket path, or HOST:PORT
    level: str       # user | operator | admin


@dataclass
class Proxy:
    kind: str                                            # frontend | backend | listen
    name: str
    where: str                                           # file:line of its section
    ports: list[tuple[int, int]] = field(default_factory=list)      # its bind lines' port ranges
    backends: list[str] = field(default_factory=list)              # default_backend, then use_backend
    servers: dict[str, int | None] = field(default_factory=dict)   # server -> its maxconn (0, None: no limit)
    values: dict = field(default_factory=dict)     # INHERITED: its own, else its defaults section's

    def listens_on(self, port: int) -> bool:
        return any(lo <= port <= hi for lo, hi in self.ports)


@dataclass
class HaproxyConfig:
    files: list[str] = field(default_factory=list)      # the files read, in HAProxy's order
    sockets: list[StatsSocket] = field(default_factory=list)
    proxies: dict[str, Proxy] = field(default_factory=dict)
    global_maxconn: int | None = None
    hints: list[str] = field(default_factory=list)      # what could not be read, and why
    base: str = "/"                                     # HAProxy's directory: where relative paths start
    defaults: dict[str, dict] = field(default_factory=lambda: {"": {}}, repr=False)   # by name; "": the latest


@dataclass(frozen=True)
class Admission:
    """Where the concurrency of the requests that come in on one port is set, and to what."""
    socket: StatsSocket
    target: str          # maxconn server BE/SRV | maxconn frontend FE, the haproxy actuator's forms
    in_force: int        # the limit haproxy.cfg gives it


# --- which files --------------------------------------------------------------------------
def named_files(argv: list[str], cwd: str) -> tuple[list[str], str]:
    """The -f and -- arguments of HAProxy's command line, absolute, and the directory
    relative paths start from (-C, else its working directory)."""
    named, base, rest = [], cwd, False
    for i, arg in enumerate(argv):
        if rest:
            named.append(arg)
        elif arg == "--":
            rest = True
        elif arg in ("-f", "-C") and i + 1 < len(argv):
            if arg == "-C":
                base = os.path.normpath(os.path.join(cwd, argv[i + 1]))
            else:
                named.append(argv[i + 1])
    return [os.path.normpath(os.path.join(base, n)) for n in named] or [DEFAULT_FILE], base


def _expand(named: str, hints: list[str]) -> list[str]:
    """A named file as it is (the service was given it, link or not); a named directory's
    *.cfg files that are not hidden, in C order, each only if it resolves inside the directory."""
    if not os.path.isdir(named):
        return [named]
    home = os.path.realpath(named)
    try:
        names = sorted(n for n in os.listdir(named) if n.endswith(".cfg") and not n.startswith("."))
    except OSError as exc:
        hints.append(f"{named}: {exc.strerror}: not read")
        return []
    out = []
    for n in names:
        path = os.path.join(named, n)
        real = os.path.realpath(path)
        if os.path.commonpath([real, home]) != home:
            hints.append(f"{path} links to {real}, outside {named}: not read (discover reads only what HAProxy "
                         f"was named on its command line); name it there with -f, or copy it into {named}")
        elif os.path.isfile(real):
            out.append(path)
    return out


def _read(path: str, hints: list[str]) -> str | None:
    """A regular file's text, opened read only through its resolved path without following
    a link on any part of it (one swapped in since it was resolved is refused; a FIFO or device
    is not read); None with a hint if it cannot be."""
    try:
        fd = open_no_links(os.path.realpath(path), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        hints.append(f"{path}: {exc.strerror}: not read")
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            hints.append(f"{path}: not a regular file: not read")
            return None
        data = f.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        hints.append(f"{path}: larger than {MAX_BYTES >> 20} MiB: not read")
        return None
    return data.decode(errors="replace")


def read(argv: list[str], cwd: str) -> HaproxyConfig:
    """The configuration of a HAProxy started with this command line in this directory."""
    files, base = named_files(argv, cwd)
    cfg = HaproxyConfig(base=base)
    for named in files:
        for path in _expand(named, cfg.hints):
            text = _read(path, cfg.hints)
            if text is not None:
                cfg.files.append(path)
                _parse(text, path, cfg)
    return cfg


def read_process(pid: int) -> HaproxyConfig:
    """read() of a running HAProxy, as it sees its files: one in another mount namespace
    (a container) is not read."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
        cwd = os.readlink(f"/proc/{pid}/cwd")
        theirs, ours = os.stat(f"/proc/{pid}/root"), os.stat("/")
    except OSError as exc:
        return HaproxyConfig(hints=[f"haproxy[{pid}]: its command line or directory: {exc.strerror}: "
                                    "its configuration was not read"])
    if (theirs.st_dev, theirs.st_ino) != (ours.st_dev, ours.st_ino):
        return HaproxyConfig(hints=[f"haproxy[{pid}] sees another root (a container): its configuration "
                                    "was not read"])
    return read(argv[1:], cwd)


# --- what they say -------------------------------------------------------------------------
def _parse(text: str, path: str, cfg: HaproxyConfig) -> None:
    """Sections and the few keywords discover needs; a file starts on a section boundary."""
    section, proxy, defaults = "", None, cfg.defaults
    for n, line in enumerate(text.splitlines(), 1):
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            cfg.hints.append(f"{path}:{n}: unbalanced quotes: line skipped")
            continue
        if not words:
            continue
        if words[0] in SECTIONS:
            section, proxy = words[0], None
            name = words[1] if len(words) > 1 and words[1] != "from" else ""
            # a defaults section starts from the manual's defaults, a proxy from the latest defaults section;
            # either from a named one with `from NAME`
            parent = defaults.get(words[words.index("from") + 1], {}) if "from" in words[:-1] else \
                {} if section == "defaults" else defaults[""]
            if section == "defaults":
                defaults[""] = defaults[name] = dict(parent)
            elif section in ("frontend", "backend", "listen") and name:
                proxy = cfg.proxies[name] = Proxy(section, name, f"{path}:{n}", values=dict(parent))
            continue
        if section == "global":
            _global(words, cfg, path, n)
        elif section == "defaults":
            _inheritable(words, defaults[""])
        elif proxy is not None:
            _proxy(words, proxy)


def _global(words: list[str], cfg: HaproxyConfig, path: str, n: int) -> None:
    if words[0] == "maxconn" and len(words) > 1 and (limit := _number(words[1])) is not None:
        cfg.global_maxconn = limit
    elif words[:2] == ["stats", "socket"] and len(words) > 2:
        level = words[words.index("level") + 1] if "level" in words[3:-1] else DEFAULT_LEVEL
        try:
            cfg.sockets.append(StatsSocket(_address(words[2], cfg.base), level))
        except Unknown as exc:
            cfg.hints.append(f"{path}:{n}: stats socket {words[2]}: {exc}")


def _address(where: str, base: str) -> str:
    """A `stats socket` address as the actuator dials it: a Unix path (a relative one
    from HAProxy's directory) or HOST:PORT."""
    if "$" in where:
        raise Unknown("names an environment variable: give the socket's address as [control] address")
    family, _, rest = where.partition("@") if "@" in where else ("", "", where)
    if family == "unix" or family == "" and not re.fullmatch(r"[^/]*:\d+", rest):
        return os.path.normpath(os.path.join(base, rest))
    host, _, port = rest.rpartition(":")
    if family not in ("", "ipv4", "ipv6", "tcp", "tcp4", "tcp6") or _number(port) is None:
        raise Unknown("is not a Unix path or an IP address and port: slotune's haproxy actuator cannot dial it")
    host = host.strip("[]")
    if family in ("ipv6", "tcp6") or ":" in host:
        return f"[{host if host not in ('', '::') else '::1'}]:{port}"
    return f"{host if host not in ('', '*', '0.0.0.0') else '127.0.0.1'}:{port}"


def _maxconn(words: list[str]) -> int | None:
    i = words.index("maxconn") + 1 if "maxconn" in words[:-1] else 0
    return _number(words[i]) if i else None


def _number(word: str) -> int | None:
    """A count as HAProxy writes one (ASCII digits, at most 10 of them), else None: a file
    with "maxconn ²" or a 5 000-digit limit is read past, never the end of discover."""
    return int(word) if word.isascii() and word.isdigit() and len(word) <= 10 else None


def _inheritable(words: list[str], into: dict) -> None:
    """maxconn, default_backend and default-server's maxconn, where a defaults section or a proxy sets them."""
    if words[0] == "maxconn" and len(words) > 1 and (limit := _number(words[1])) is not None:
        into["maxconn"] = limit
    elif words[0] == "default_backend" and len(words) > 1:
        into["default_backend"] = words[1]
    elif words[0] == "default-server" and (limit := _maxconn(words)) is not None:
        into["server_maxconn"] = limit


def _proxy(words: list[str], proxy: Proxy) -> None:
    _inheritable(words, proxy.values)
    if words[0] == "bind" and len(words) > 1:
        for one in words[1].split(","):
            m = re.fullmatch(r"(?:(?:ipv4|ipv6|tcp|tcp4|tcp6)@)?\[?[^@\]]*\]?:([0-9]{1,5})(?:-([0-9]{1,5}))?", one)
            if m:
                proxy.ports.append((int(m[1]), int(m[2] or m[1])))
    elif words[0] == "use_backend" and len(words) > 1:
        proxy.backends.append(words[1])
    elif words[0] == "server" and len(words) > 2:    # default-server applies to the servers after it
        proxy.servers[words[1]] = _server_limit(words[3:], proxy)
    elif words[0] == "server-template" and len(words) > 3 and (m := re.fullmatch(r"([0-9]{1,6})(?:-([0-9]{1,6}))?", words[2])):
        lo, hi = (int(m[1]), int(m[2])) if m[2] else (1, int(m[1]))     # <num> or <first>-<last>
        limit = _server_limit(words[4:], proxy)
        proxy.servers.update({f"{words[1]}{i}": limit for i in range(lo, min(hi, lo + 9999) + 1)})


def _server_limit(params: list[str], proxy: Proxy) -> int | None:
    own = _maxconn(params)
    return own if own is not None else proxy.values.get("server_maxconn")


def admission(cfg: HaproxyConfig, port: int) -> Admission:
    """The runtime API and the limit of the requests that come in on this port; Unknown says what is missing."""
    found = _admission(cfg, port)
    if (why := target_error(found.target)) is not None:      # a name HAProxy itself would refuse
        raise Unknown(why)
    return found


def _admission(cfg: HaproxyConfig, port: int) -> Admission:
    if not cfg.sockets:
        raise Unknown(f"no `stats socket` in the global section of {', '.join(cfg.files) or 'its config'}: add "
                      "`stats socket /run/haproxy/admin.sock mode 600 level admin` and reload HAProxy")
    sock = next((s for s in cfg.sockets if s.level == "admin"), cfg.sockets[0])
    front = next((p for p in cfg.proxies.values() if p.kind in ("frontend", "listen") and p.listens_on(port)), None)
    if front is None:
        raise Unknown(f"no frontend or listen section binds port {port} in {', '.join(cfg.files)}")
    backends = ([front.name] if front.kind == "listen" and front.servers else []) + front.backends + \
        ([front.values["default_backend"]] if "default_backend" in front.values else [])
    if not backends:
        raise Unknown(f"{front.kind} {front.name} (port {port}) passes requests to no backend: tune the port "
                      "of the frontend that proxies to your servers")
    be = cfg.proxies.get(backends[0])
    if len(set(backends)) == 1 and be is not None and len(be.servers) == 1:
        server, limit = next(iter(be.servers.items()))
        if not limit:
            raise Unknown(f"server {be.name}/{server} has no maxconn in haproxy.cfg ({be.where}): give it one "
                          "(e.g. maxconn 64) for slotune to tune it")
        return Admission(sock, f"maxconn server {be.name}/{server}", limit)
    limit = front.values.get("maxconn") or cfg.global_maxconn     # 0 is the global one, as none is
    if not limit:
        raise Unknown(f"{front.kind} {front.name} ({front.where}) has no maxconn, nor has the global section: "
                      "give it one for slotune to tune it")
    return Admission(sock, f"maxconn frontend {front.name}", limit)


def admission_of(pid: int, port: int) -> tuple[Admission | None, list[str]]:
    """admission() of a running HAProxy's port, and the hints of what could not be read."""
    cfg = read_process(pid)
    try:
        return admission(cfg, port), cfg.hints
    except Unknown as exc:
        return None, [*cfg.hints, str(exc)]
