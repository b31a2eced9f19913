"""Finds each service's processes (command-line regex, systemd unit, cgroup path,
user, listening port; all given ones must match) and keeps the set current: each
scan reads one small /proc/<pid>/stat per process and evaluates the full match
only for processes it has not seen before (or that exec'ed since), within a time
budget. Threads count with their process. The kernel side (bpf/targeting.bpf.c)
adds forks between scans. Each process's network namespace is known, and its
listening ports are read in that namespace (/proc/<pid>/net), so a service in a
container is seen there and its ports never mix with another namespace's."""
from __future__ import annotations

import functools
import logging
import os
import re
import time
from dataclasses import dataclass, field

from slotune.host.proc_clock import CLOCK_TICKS, uptime_s
from slotune.model.service import ServiceSpec

CGROUP_ROOT = "/sys/fs/cgroup"
# Any local user can start a process whose command line (up to 2 MiB) a cmdline pattern
# reads, and a backtracking pattern takes time quadratic in the text: so a pattern sees
# only the line's head, and a scan stops matching new processes once its budget is spent.
CMDLINE_BYTES = 4096
SCAN_BUDGET_S = 0.25
# A process this young may still be turning into what it will be (a forked worker
# drops privileges and renames itself after the fork): a miss is not remembered.
SETTLING_S = 2.0

log = logging.getLogger(__name__)


class TargetingError(ValueError):
    """A service declaration that cannot find processes."""


@dataclass
class ServiceProcesses:
    service: ServiceSpec
    tgids: set[int] = field(default_factory=set)
    tids: set[int] = field(default_factory=set)
    netns: dict[int, int] = field(default_factory=dict)               # tgid -> inode of /proc/<pid>/ns/net
    listen_ports: set[tuple[int, int]] = field(default_factory=set)   # (netns, port) it listens on


def validate(spec: ServiceSpec) -> tuple[re.Pattern | None, int | None]:
    """Check a service declaration; returns its compiled cmdline pattern and its uid."""
    if not (spec.cmdline or spec.systemd_unit or spec.cgroup or spec.port or spec.user is not None):
        raise TargetingError(f"service {spec.name!r} has no way to find its processes: "
                             "set cmdline, systemd_unit, cgroup, port or user")
    if spec.port is not None and not 0 < spec.port < 65536:
        raise TargetingError(f"service {spec.name!r}: port {spec.port} is not a TCP port (1..65535)")
    try:
        uid = spec.uid()
    except ValueError as exc:
        raise TargetingError(f"service {spec.name!r}: {exc}") from None
    if spec.cmdline is None:
        return None, uid
    try:
        return re.compile(spec.cmdline), uid
    except re.error as exc:
        raise TargetingError(f"service {spec.name!r}: cmdline {spec.cmdline!r} is not a valid "
                             f"regular expression ({exc})") from None


def command_line(pid: int) -> str:
    """The command line's first CMDLINE_BYTES, arguments joined by spaces ("" when gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb", buffering=0) as f:
            raw = f.read(CMDLINE_BYTES)
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def process_uids(pid: int) -> tuple[int, int] | None:
    """(real, effective) uid of a process, from /proc/<pid>/status."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"Uid:"):
                    real, effective = line.split()[1:3]
                    return int(real), int(effective)
    except (OSError, ValueError):
        pass
    return None


def stat_identity(pid: int) -> tuple[bytes, int] | None:
    """(comm, start time) of a process: changes when the pid is reused or exec's. Read
    with bare os calls, the name left in bytes and the fields after the start time not
    split: it runs for every process of the host on every scan, and a Python file
    object costs as much again as the read (0.9 vs 1.9 ms per 110 processes)."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
    except OSError:
        return None
    try:
        raw = os.read(fd, 4096)   # one read returns the whole line (~350 bytes)
    except OSError:
        return None
    finally:
        os.close(fd)
    close = raw.rfind(b")")
    return raw[raw.find(b"(") + 1:close], int(raw[close + 2:].split(None, 20)[19])


def cgroup_paths(pid: int) -> dict[str, str]:
    """The process's cgroup per hierarchy: "" is cgroup v2 (unified), v1 hierarchies
    by controller ("memory") or name ("systemd"), e.g. {"": "/system.slice/web.service"}."""
    out = {}
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            for line in f:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                for c in controllers.split(",") if controllers else [""]:
                    out[c.removeprefix("name=")] = path
    except (OSError, ValueError):
        pass
    return out


def cgroup_target(spec_path: str) -> tuple[str, str]:
    """(hierarchy, path) a declared cgroup means: /sys/fs/cgroup/web.slice,
    /web.slice, /sys/fs/cgroup/unified/web.slice (hybrid hosts) or
    /sys/fs/cgroup/memory/web.slice (a v1 hierarchy)."""
    rel = "/" + spec_path.removeprefix(CGROUP_ROOT).strip("/")
    first, _, rest = rel[1:].partition("/")
    pure_v2 = os.path.exists(f"{CGROUP_ROOT}/cgroup.procs")
    if not pure_v2 and spec_path.startswith(CGROUP_ROOT + "/") and os.path.isdir(f"{CGROUP_ROOT}/{first}"):
        # Hybrid or v1 layout: the first component names a hierarchy's mount.
        return ("" if first == "unified" else first), "/" + rest
    return "", rel


def unit_name(unit: str) -> str:
    return unit if "." in unit else unit + ".service"


def under(path: str, parent: str) -> bool:
    return parent == "/" or path == parent or path.startswith(parent.rstrip("/") + "/")


def threads(pid: int) -> set[int]:
    try:
        return {int(t) for t in os.listdir(f"/proc/{pid}/task")}
    except OSError:
        return set()


def netns_of(pid: int) -> int | None:
    """Inode of the process's network namespace (what `ip netns identify` compares)."""
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


def listening_table(net_dir: str) -> dict[int, int]:
    """Listening TCP sockets of one network namespace, socket inode -> port, from
    <net_dir>/tcp and tcp6: /proc/net is our own namespace, /proc/<pid>/net the process's."""
    return {inode: port for inode, _, port in listening_rows(net_dir)}


def listening_rows(net_dir: str) -> list[tuple[int, str, int]]:
    """(socket inode, local address as the kernel writes it: hex, port) of each listening
    TCP socket in <net_dir>/tcp and tcp6."""
    out = []
    for name in ("tcp", "tcp6"):
        try:
            with open(f"{net_dir}/{name}") as f:
                next(f, None)
                for line in f:
                    fields = line.split()
                    if len(fields) > 9 and fields[3] == "0A":   # TCP_LISTEN
                        address, _, port = fields[1].rpartition(":")
                        out.append((int(fields[9]), address, int(port, 16)))
        except (OSError, ValueError):
            pass
    return out


def own_listening_table() -> dict[int, int]:
    """listening_table("/proc/net"), asked of the kernel by sock_diag netlink with a
    LISTEN filter: /proc/net/tcp formats every socket of the namespace, and a busy
    host has thousands (TIME_WAIT), read every interval. Falls back to /proc/net."""
    import socket
    import struct
    out: dict[int, int] = {}
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, SOCK_DIAG) as nl:
            for family in (socket.AF_INET, socket.AF_INET6):
                # nlmsghdr + inet_diag_req_v2 (family, IPPROTO_TCP, ext, pad, states, 48-byte sockid)
                req = struct.pack("=LHHLLBBBxL48x", 72, SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP,
                                  family, 0, family, socket.IPPROTO_TCP, 0, 1 << TCP_LISTEN)
                nl.sendto(req, (0, 0))
                while not _diag_replies(nl.recv(65536), out):
                    pass
    except OSError:
        return listening_table("/proc/net")
    return out


SOCK_DIAG, SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, NLM_F_DUMP, TCP_LISTEN = 4, 20, 1, 0x300, 10
NLMSG_DONE, NLMSG_ERROR = 3, 2


def _diag_replies(data: bytes, out: dict[int, int]) -> bool:
    """Add the (inode -> port) of each inet_diag_msg in one netlink read; True at the dump's end."""
    import struct
    off = 0
    while off + 16 <= len(data):
        length, kind = struct.unpack_from("=LH", data, off)
        if kind == NLMSG_DONE:
            return True
        if kind == NLMSG_ERROR or length < 16:
            raise OSError("sock_diag refused the dump")
        port = struct.unpack_from("!H", data, off + 16 + 4)[0]        # idiag_sport, network order
        inode = struct.unpack_from("=L", data, off + 16 + 68)[0]      # idiag_inode
        out[inode] = port
        off += (length + 3) & ~3
    return False


def listening_tables(own_netns: int | None, pids: dict[int, int]) -> dict[int | None, dict[int, int]]:
    """netns -> its listening table, for our own namespace and those of `pids`
    (netns -> one process in it)."""
    tables = {own_netns: own_listening_table()}
    for netns, pid in pids.items():
        tables[netns] = listening_table(f"/proc/{pid}/net")
    return tables


def listening_sockets(tables: dict) -> frozenset[int]:
    """Inodes of every listening socket in these tables: a cheap fingerprint that
    changes exactly when some process there starts or stops listening."""
    return frozenset(inode for table in tables.values() for inode in table)


def socket_inodes(pid: int) -> set[int]:
    """Inodes of the sockets the process holds open (its fds that read socket:[N])."""
    out: set[int] = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            out.add(int(target[8:-1]))
    return out


def holders(inodes, pids=None) -> dict[int, set[int]]:
    """pid -> which of these socket inodes it holds, for each process holding one: a walk of
    the fds of pids, or of every process (only a socket's holder says who it is)."""
    out, inodes = {}, set(inodes)
    if pids is None:
        pids = [int(entry.name) for entry in os.scandir("/proc") if entry.name.isdigit()]
    for pid in pids:
        if held := socket_inodes(pid) & inodes:
            out[pid] = held
    return out


def still_held(last: dict[int, set[int]], unheld: set[int], listening: set[int],
               new_pids: list[int] | None) -> tuple[dict[int, set[int]], set[int], bool]:
    """(holders(listening), the sockets no process holds, whether every process was walked)
    from the last answer: what is still listening keeps its holders (those still alive), or
    stays unheld (a kernel's own socket); a socket new since is looked for in new_pids first
    (the processes started since every process was last walked: a service that restarted
    holds its own), in every process only if some are still not found (or new_pids is None).
    100 000 idle connections on the host make a walk of every fd cost seconds."""
    held = {pid: inodes & listening for pid, inodes in last.items()
            if inodes & listening and os.path.exists(f"/proc/{pid}")}
    new, walked_all = listening - unheld - set().union(*held.values()), False
    for pids in ([new_pids, None] if new_pids is not None else [None]) if new else []:
        for pid, inodes in holders(new, pids).items():
            held[pid] = held.get(pid, set()) | inodes
        new -= set().union(*held.values())
        walked_all = pids is None
        if not new:
            break
    return held, (unheld & listening) | new, walked_all


def listening_ports(pid: int, tables: dict, own: int | None,
                    own_held: dict[int, set[int]]) -> tuple[int | None, set[int]]:
    """(network namespace, ports the process listens on there); (None, set()) when it is gone.
    `tables` (netns -> listening table) are reused and filled in; in our own namespace the
    process's sockets are those holders() found (own_held), not read again."""
    netns = netns_of(pid)
    if netns is None:
        return None, set()
    if netns not in tables:
        tables[netns] = listening_table(f"/proc/{pid}/net")
    table = tables[netns]
    held = own_held.get(pid, set()) if netns == own else socket_inodes(pid)
    return netns, {table[inode] for inode in held if inode in table}


class Targeting:
    """scan() -> {service name: ServiceProcesses}; cheap enough to call every interval."""

    def __init__(self, services: list[ServiceSpec], scan_budget_s: float = SCAN_BUDGET_S):
        self.own_pid = os.getpid()
        self.scan_budget_s = scan_budget_s
        self.over_budget: set[str] = set()      # services already named in a budget warning
        self._take(services)

    def update_services(self, services: list[ServiceSpec]) -> bool:
        """Take a new list of services; False for the same list (a reload that changed
        something else), which keeps what the scans learned: a SIGHUP costs no rescan."""
        if list(services) == self.services:
            return False
        self._take(services)
        return True

    def _take(self, services: list[ServiceSpec]) -> None:
        """The services, checked (TargetingError), and nothing learned of the processes yet."""
        names = [s.name for s in services]
        dupes = {n for n in names if names.count(n) > 1}
        if dupes:
            raise TargetingError(f"service names must be unique; repeated: {', '.join(sorted(dupes))}")
        checked = {s.name: validate(s) for s in services}
        self.patterns = {name: pattern for name, (pattern, _) in checked.items()}
        self.uids = {name: uid for name, (_, uid) in checked.items()}
        self.services = list(services)
        self.seen: dict[int, tuple[tuple[bytes, int], frozenset[str]]] = {}
        self.listen_inodes: frozenset[int] | None = None   # listening sockets at the last scan
        self.port_inodes: frozenset[int] | None = None     # listening on the declared ports, at the last read
        self.listeners: dict[int, set[int]] = {}            # declared port -> pids, while they stay the same
        self.declared_sockets: dict[int, int] = {}          # listening socket inode -> declared port, in our netns
        self.pid_ports: dict[int, tuple[int | None, set[int]]] = {}   # pid -> (netns, its listening ports), likewise
        self.own_held: dict[int, set[int]] = {}   # pid -> the listening sockets it holds in our netns, likewise
        self.unheld: set[int] = set()             # listening sockets in our netns no process holds
        self.walked_at: float | None = None       # when every process's fds were last walked (clock ticks)
        self.other_netns: dict[int, int] = {}               # netns -> one service pid in it, not our own

    def matches(self, pid: int, spec: ServiceSpec, listeners: dict[int, set[int]], held=None) -> bool:
        """The command line, which another user may have written, is read last: only
        for processes that passed every other finder the service gives. A process
        started since every process's fds were last walked, and not among the port's
        listeners, is asked for its own sockets (held(): the declared ports it holds):
        a worker forked after that walk (nginx after a reload) holds the listening
        socket it inherited, and the walk is redone only when listening sockets change."""
        if spec.port is not None and pid not in listeners.get(spec.port, set()) and not (
                held is not None and spec.port in held()):
            return False
        uid = self.uids[spec.name]
        if uid is not None and process_uids(pid) != (uid, uid):
            return False
        if spec.systemd_unit or spec.cgroup:
            paths = cgroup_paths(pid)
            if spec.systemd_unit and not any(unit_name(spec.systemd_unit) in p.split("/")
                                             for p in paths.values()):
                return False
            if spec.cgroup:
                hierarchy, parent = cgroup_target(spec.cgroup)
                if hierarchy not in paths or not under(paths[hierarchy], parent):
                    return False
        pattern = self.patterns[spec.name]
        if pattern is not None:
            cmdline = command_line(pid)
            if not cmdline or not pattern.search(cmdline):
                return False
        return True

    def held_ports(self, pid: int) -> set[int]:
        """The declared ports whose listening sockets (in our namespace) the process holds."""
        if not self.declared_sockets:
            return set()
        return {self.declared_sockets[i] for i in socket_inodes(pid) if i in self.declared_sockets}

    def match_all(self, pid: int, listeners: dict[int, set[int]], spent: dict[str, float],
                  new: bool = False) -> frozenset[str]:
        """The services pid belongs to; adds the time each service's match took to spent.
        A new process's fds are read at most once, whatever the number of services: one
        holding 16 000 connections costs ~0.1 s a read."""
        names, held = set(), functools.cache(lambda: self.held_ports(pid)) if new else None
        for s in self.services:
            t0 = time.perf_counter()
            if self.matches(pid, s, listeners, held):
                names.add(s.name)
            spent[s.name] = spent.get(s.name, 0.0) + time.perf_counter() - t0
        return frozenset(names)

    @staticmethod
    def _started_since(ticks: float | None) -> list[int] | None:
        """The processes started at or after ticks (since boot); None for every one."""
        if ticks is None:
            return None
        return [int(e.name) for e in os.scandir("/proc")
                if e.name.isdigit() and (ident := stat_identity(int(e.name))) and ident[1] >= ticks]

    def port_listeners(self) -> dict[int, set[int]]:
        """Declared port -> pids holding its listening sockets: ports of our own network
        namespace (the host's); a containerised service is found by its other finders, and
        its ports are then read in its namespace. Every process's fds are read (only a socket's
        holder says who it is), but only the declared listening sockets are looked for: the
        host's other connections, 100 000 idle ones say, are neither listed nor decoded."""
        declared = {s.port for s in self.services if s.port}
        sockets = {inode: port for inode, port in own_listening_table().items() if port in declared}
        return _by_port(holders(sockets.keys()) if sockets else {}, sockets)

    def scan(self) -> dict[str, ServiceProcesses]:
        found = {s.name: ServiceProcesses(s) for s in self.services}
        own = netns_of(self.own_pid)
        tables = listening_tables(own, self.other_netns)
        inodes = listening_sockets(tables)
        # Who holds which listening socket takes every process's fds (holders()): read, once for
        # the declared ports and the services' own ports, only when some listening socket changed.
        fresh = inodes != self.listen_inodes
        if fresh:
            self.listen_inodes, self.pid_ports = inodes, {}
            now_ticks = uptime_s() * CLOCK_TICKS
            # Our own listening sockets (the exporter's, opened after the first scan) are no
            # service's: looked for, their holder being older than any walk, they cost a walk.
            theirs = set(tables[own]) - socket_inodes(self.own_pid)
            self.own_held, self.unheld, walked_all = still_held(self.own_held, self.unheld, theirs,
                                                                self._started_since(self.walked_at))
            if walked_all:
                self.walked_at = now_ticks - CLOCK_TICKS     # a second's margin for a start being read
        declared = {s.port for s in self.services if s.port}
        self.declared_sockets = {inode: port for inode, port in tables[own].items() if port in declared}
        port_inodes = frozenset(self.declared_sockets)
        relisten = port_inodes != self.port_inodes
        if relisten:
            self.port_inodes, self.listeners = port_inodes, _by_port(self.own_held, self.declared_sockets)
        listeners = self.listeners
        settled_start = (uptime_s() - SETTLING_S) * CLOCK_TICKS   # processes started before this have settled
        alive = {}
        spent: dict[str, float] = {}   # service -> seconds its matches took this scan
        waiting = 0                    # new processes left for the next scans
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            if pid == self.own_pid:
                continue
            ident = stat_identity(pid)
            if ident is None:
                continue
            cached = self.seen.get(pid)
            known = cached is not None and cached[0] == ident
            if cached is not None and known and not (relisten and listeners):
                names = cached[1]
            elif sum(spent.values()) > self.scan_budget_s:
                # Out of time: known processes keep their services, new ones stay out of
                # `seen` so that a later scan matches them.
                if cached is None or not known:
                    waiting += 1
                    continue
                names = cached[1]
            else:
                names = self.match_all(pid, listeners, spent, new=not known and (
                    self.walked_at is None or ident[1] >= self.walked_at))
                if not names and ident[1] > settled_start:
                    continue                 # matched again next scan, once it has settled
            alive[pid] = (ident, names)
            for name in names:
                found[name].tgids.add(pid)
        self.seen = alive
        if sum(spent.values()) > self.scan_budget_s:
            if relisten:
                self.port_inodes = None      # port matches were cut short: redo them next scan
            self._warn_over_budget(spent, waiting)
        for procs in found.values():
            for pid in procs.tgids:
                procs.tids |= threads(pid)
                if pid not in self.pid_ports:
                    self.pid_ports[pid] = listening_ports(pid, tables, own, self.own_held)
                netns, ports = self.pid_ports[pid]
                if netns is not None:
                    procs.netns[pid] = netns
                    procs.listen_ports |= {(netns, port) for port in ports}
        self.other_netns = {netns: pid for procs in found.values() for pid, netns in procs.netns.items()
                            if netns != own}
        return found

    def _warn_over_budget(self, spent: dict[str, float], waiting: int) -> None:
        """Name the service whose matching took longest, once."""
        name = max(spent, key=spent.__getitem__)
        if name in self.over_budget:
            return
        self.over_budget.add(name)
        fix = (" Its cmdline pattern reads command lines any local user can write: give it user, "
               "systemd_unit or cgroup as well (checked first, so the pattern reads only its own "
               "processes), or a pattern that does not backtrack."
               if self.patterns.get(name) is not None else "")
        log.warning("service %s: matching its processes took %.2f s of one scan (budget %.2f s); "
                    "%d new processes wait for the next scans.%s",
                    name, spent[name], self.scan_budget_s, waiting, fix)


def _by_port(held: dict[int, set[int]], sockets: dict[int, int]) -> dict[int, set[int]]:
    """port -> the pids holding its sockets, from holders()' pid -> inodes."""
    out: dict[int, set[int]] = {}
    for pid, inodes in held.items():
        for inode in inodes & sockets.keys():
            out.setdefault(sockets[inode], set()).add(pid)
    return out
