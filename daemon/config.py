"""The daemon's TOML configuration: parsed once, checked completely, and refused
with the file, the key and the reason when anything is unknown or out of range.
`slotune.example.toml` at the repo root documents every key."""
from __future__ import annotations

import math
import os
import re
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slotune.actuators import ACTUATORS, Control
from slotune.collectors.kernel.families import FAMILIES, http
from slotune.collectors.kernel.program import MAP_ENTRIES, MAP_ENTRIES_RANGE
from slotune.model.histogram import BUCKETS_PER_OCTAVE
from slotune.model.service import ServiceSpec
from slotune import profiles

if TYPE_CHECKING:
    from slotune.tuners.base import Spec

DEFAULT_PATH = Path("/etc/slotune/slotune.toml")
PROBE_FAMILIES = tuple(FAMILIES)     # every kernel probe family (daemon/collectors/kernel/families/)
BASELINE_SOURCES = ("local", "prometheus")


class ConfigError(ValueError):
    def __init__(self, file: Path | str, key: str, reason: str):
        super().__init__(f"{file}: {key}: {reason}")
        self.file, self.key, self.reason = str(file), key, reason


@dataclass(frozen=True)
class Bounds:
    min: float
    max: float
    max_step: float
    integer: bool = False    # pushed as a whole number (batch sizes, limits)
    in_force: float | None = None   # a restart-only setting's value as started (it cannot be read back)


@dataclass(frozen=True)
class TunerConf:
    name: str
    policy: str
    interval_s: float
    options: dict[str, float] = field(default_factory=dict)   # its own keys (its module's SPEC, tuners/)


@dataclass(frozen=True)
class ServiceConf:
    spec: ServiceSpec
    downstream: tuple[str, ...] = ()
    control: Control | None = None
    tuners: tuple[TunerConf, ...] = ()
    settings: dict[str, Bounds] = field(default_factory=dict)
    admission_by: str = ""      # the service (a proxy) whose control surface takes its throttle's settings
    recommend: dict[str, str] = field(default_factory=dict)   # restart-only setting -> how it is set

    @property
    def name(self) -> str:
        return self.spec.name


@dataclass(frozen=True)
class ExportConf:
    """[export]: where decisions and metrics also go besides /metrics (daemon/export/sinks.py)."""
    grafana_url: str = ""              # decisions as Grafana annotations
    grafana_token_file: str = ""       # a service-account token (Editor), read as the actuators read theirs
    grafana_dashboard_uid: str = ""    # on this dashboard; "" = organization annotations
    otlp_endpoint: str = ""            # OTLP/HTTP base URL: decisions to /v1/logs, metrics to /v1/metrics
    otlp_metrics: bool = True
    otlp_metrics_interval_s: float = 30.0
    buckets_per_octave: int = 8        # the exported latency histograms' steps per power of two


@dataclass(frozen=True)
class Config:
    path: str
    collect_interval_s: float = 1.0
    tune_interval_s: float | None = None     # None: each tuner decides at its own INTERVAL_S
    exporter_address: str = "127.0.0.1:9477"
    baseline_store: str = "/var/lib/slotune/baselines.sqlite"
    baseline_retention_days: float = 35.0     # points older than this are pruned (drift reads 7 days)
    audit_log: str = "/var/lib/slotune/audit.jsonl"
    state_file: str = "/var/lib/slotune/state.json"   # the guards' memory across restarts (beside audit_log)
    environment: str = "production"
    deploy_id: str = "unknown"
    dry_run: bool = False
    prometheus_url: str = ""
    baseline_source: str = "local"            # where the drift tuner reads its baseline: local | prometheus
    probes: tuple[str, ...] = PROBE_FAMILIES
    bpf_map_entries: dict[str, int] = field(default_factory=lambda: dict(MAP_ENTRIES))   # BPF map -> size
    services: tuple[ServiceConf, ...] = ()
    export: ExportConf = field(default_factory=ExportConf)

    def service(self, name: str) -> ServiceConf:
        for svc in self.services:
            if svc.name == name:
                return svc
        known = ", ".join(s.name for s in self.services) or "none"
        raise KeyError(f"no service {name!r} in {self.path}; configured: {known}")

    @property
    def exporter_host_port(self) -> tuple[str, int]:
        host, _, port = self.exporter_address.rpartition(":")
        return host or "127.0.0.1", int(port)


class _Reader:
    """Pops keys from one TOML table so that whatever is left over is unknown."""

    def __init__(self, file: Path, where: str, table: dict):
        if not isinstance(table, dict):
            raise ConfigError(file, where, f"must be a table, got {type(table).__name__}")
        self.file, self.where, self.table = file, where, dict(table)

    def key(self, name: str) -> str:
        return f"{self.where}.{name}" if self.where else name

    def get(self, name, kind, default=None, lo=None, hi=None, choices=None, nonempty=False):
        if name not in self.table:
            return default
        value = self.table.pop(name)
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            raise ConfigError(self.file, self.key(name), f"must be {kind.__name__}, got {value!r}")
        if kind is float and not math.isfinite(value):
            raise ConfigError(self.file, self.key(name), f"must be a finite number, got {value!r}")
        if kind is str and nonempty and not value.strip():
            raise ConfigError(self.file, self.key(name), "must not be empty")
        if lo is not None and value < lo or hi is not None and value > hi:
            raise ConfigError(self.file, self.key(name), f"{value!r} is outside {lo}..{hi}")
        if choices is not None and value not in choices:
            raise ConfigError(self.file, self.key(name), f"{value!r} is not one of {', '.join(map(str, choices))}")
        return value

    def table_of(self, name: str) -> "_Reader":
        return _Reader(self.file, self.key(name), self.table.pop(name, {}))

    def done(self) -> None:
        if self.table:
            unknown = sorted(self.table)[0]
            raise ConfigError(self.file, self.key(unknown), "unknown key (see slotune.example.toml for the valid ones)")


def _regex(file, key, value):
    if value is None:
        return None
    try:
        re.compile(value)
    except re.error as exc:
        raise ConfigError(file, key, f"not a valid regular expression: {exc}") from None
    return value


def _service(file: Path, name: str, r: _Reader, default_tune_s: float | None) -> ServiceConf:
    metrics_url = r.get("metrics_url", str, "")
    profile = profiles.get(r.get("profile", str, profiles.DEFAULT, choices=profiles.NAMES))
    spec = ServiceSpec(
        name=name,
        metrics_url=metrics_url,
        profile=profile.name,
        systemd_unit=r.get("systemd_unit", str),
        cgroup=r.get("cgroup", str),
        cmdline=_regex(file, r.key("cmdline"), r.get("cmdline", str)),
        port=r.get("port", int, lo=1, hi=65535),
        user=r.table.pop("user", None),
        latency_metric=r.get("latency_metric", str, ""),
        slo_p99_s=r.get("slo_p99_ms", float, 500.0, lo=0.1, hi=600_000.0) / 1000.0,
        slo_ttft_p99_s=r.get("slo_ttft_p99_ms", float, 0.0, lo=0.1, hi=600_000.0) / 1000.0,
        slo_tpot_p99_s=r.get("slo_tpot_p99_ms", float, 0.0, lo=0.1, hi=600_000.0) / 1000.0,
        ttft_metric=r.get("ttft_metric", str, ""),
        tpot_metric=r.get("tpot_metric", str, ""),
        peers=_peers(file, r.table_of("peers")),
        untimed_paths=_untimed_paths(file, r),
        routes=_routes(file, r),
    )
    if not any((spec.systemd_unit, spec.cgroup, spec.cmdline, spec.port, spec.user is not None)):
        raise ConfigError(file, r.where, "needs at least one of systemd_unit, cgroup, cmdline, port, user to find its processes")
    try:
        spec.uid()
    except ValueError as exc:
        raise ConfigError(file, r.key("user"), str(exc)) from None
    for key in ("latency_metric", "ttft_metric", "tpot_metric"):
        if getattr(spec, key) and not metrics_url:
            raise ConfigError(file, r.key(key), "needs metrics_url to read it from")
    downstream = tuple(r.get("downstream", list, []))
    for dep in downstream:
        if not isinstance(dep, str):
            raise ConfigError(file, r.key("downstream"), f"lists service names (strings), got {dep!r}")
    if metrics_url:   # the profile's signals stand in for the families the service does not name
        filled: dict[str, Any] = {k: v for k, v in profile.default_metrics().items() if not getattr(spec, k)}
        spec = replace(spec, **filled)
    admission_by = r.get("admission_by", str, "", nonempty=True)
    control = _control(file, r.table_of("control")) if "control" in r.table else None
    if admission_by and control is not None:
        raise ConfigError(file, r.key("admission_by"), "a service with admission_by has its settings pushed through "
                          f"{admission_by!r}'s control surface: remove its own [control] table, or admission_by")
    settings = _settings(file, r.table_of("settings"))
    recommend = _recommend(file, r, profile, control, settings, admission_by)
    elsewhere = set(recommend) | (admission_settings() if admission_by else set())
    tuners = _tuners(file, r, default_tune_s, control, settings, spec, elsewhere)
    r.done()
    return ServiceConf(spec, downstream, control, tuners, settings, admission_by, recommend)


def admission_settings() -> set[str]:
    """The settings that admit requests: a service whose engine has no live knob for them
    names the proxy in front of it (admission_by), and they are pushed there."""
    from slotune.tuners import throttle   # here: tuners/ imports scipy (drift), ~0.7 s that only load() needs
    return {s for policy in throttle.POLICIES for s in throttle.SPEC.pushes(policy)}


def _recommend(file, r: _Reader, profile: profiles.Profile, control: Control | None, settings: dict[str, Bounds],
               admission_by: str) -> dict[str, str]:
    """Each setting checked against the service's profile; those it can only take at a
    restart -> how it is set (slotune recommends them instead of pushing)."""
    out = {}
    for name in settings:
        key = r.key(f"settings.{name}")
        if admission_by and name in admission_settings() or profile.settings is None:
            continue     # the proxy's profile decides (checked in load), or its own surface does
        s = profile.setting(name)
        if s is None:
            has = ", ".join(x.name for x in profile.settings)
            raise ConfigError(file, key, f"profile {profile.name} has no setting {name}; " + (
                f"its settings: {has}" if has else f"{profile.name} is read-only for slotune, remove it")
                + ("; to throttle it at a proxy in front, set admission_by" if not admission_by else ""))
        if not s.live:
            if settings[name].in_force is None:
                raise ConfigError(file, f"{key}.in_force", f"missing: {name} is restart-only on {profile.name} "
                                  f"({s.target}), slotune cannot read it back; give the value it was started with")
            out[name] = s.target
        elif control is not None and control.kind != s.kind:
            raise ConfigError(file, r.key("control.kind"), f"profile {profile.name} pushes {name} through the "
                              f"{s.kind} actuator ({s.target}), not {control.kind}: set kind = \"{s.kind}\"")
    return out


def _admission(file, svc: ServiceConf, services: dict[str, ServiceConf]) -> None:
    """admission_by names a service whose own profile and [control] take the throttle's settings."""
    key = f"services.{svc.name}.admission_by"
    proxy = services.get(svc.admission_by)
    if proxy is None or proxy is svc:
        raise ConfigError(file, key, f"{svc.admission_by!r} is not another declared service: name the proxy in "
                          f"front of {svc.name} (e.g. its haproxy service)")
    if proxy.control is None:
        raise ConfigError(file, key, f"service {proxy.name} has no [control] table to push {svc.name}'s limits "
                          f"through: give it one (e.g. kind = \"haproxy\")")
    profile = profiles.get(proxy.spec.profile)
    for name in sorted(admission_settings() & set(svc.settings)):
        s = profile.setting(name)
        if profile.settings is None:
            continue
        if s is None or not s.live or s.kind != proxy.control.kind:
            raise ConfigError(file, f"services.{svc.name}.settings.{name}", f"{proxy.name} (profile "
                              f"{profile.name}, control kind {proxy.control.kind}) has no live {name}; "
                              f"admission_by needs a proxy that can take it")
        targets = ACTUATORS[proxy.control.kind].TARGETS
        if targets is not None and targets.required and name not in proxy.control.targets:
            raise ConfigError(file, f"services.{proxy.name}.control.targets.{name}", f"missing: {svc.name}'s "
                              f"throttle pushes {name} through {proxy.name}; name it there, e.g. \"{s.target}\"")


# A path as the request line has it, up to the longest route the kernel compares (an
# untimed path alike): printable characters, no space ('?' is refused apart).
PATH = re.compile(rf"/[!-~]{{0,{http.ROUTE_BYTES - 1}}}")
UNTIMED_PATHS = 16      # per service


def _paths(file, r: _Reader, name: str, most: int) -> tuple[str, ...]:
    """The list of paths (or path prefixes) under key `name`, at most `most`."""
    paths = r.get(name, list, [])
    if len(paths) > most:
        raise ConfigError(file, r.key(name), f"at most {most} paths")
    for path in paths:
        if not isinstance(path, str) or not PATH.fullmatch(path) or "?" in path:
            raise ConfigError(file, r.key(name), f"{path!r} is not a path: give it as the request line has it, "
                              f"starting with '/', up to {http.ROUTE_BYTES} printable characters without spaces or '?'")
    return tuple(paths)


def _untimed_paths(file, r: _Reader) -> tuple[str, ...]:
    """untimed_paths = ["/healthz", ...]: requests the http family neither counts nor times
    (the path as the request line has it, before any '?'; the metrics_url's own is added)."""
    return _paths(file, r, "untimed_paths", UNTIMED_PATHS)


def _routes(file, r: _Reader) -> tuple[str, ...]:
    """routes = ["/v1/chat/completions", ...]: path prefixes the http family classes requests
    by, the first that starts a request's path (the others' class: "other"); the service is
    judged on its routes' requests alone (model/routes.py)."""
    routes = _paths(file, r, "routes", http.ROUTES)
    for i, route in enumerate(routes):
        if shadow := next((e for e in routes[:i] if route.startswith(e)), None):
            raise ConfigError(file, r.key("routes"), f"{route!r} would never be matched: {shadow!r}, listed "
                              "before it, starts it (a request takes the first route that starts its path); "
                              "list the longer one first, or once")
    return routes


def _peers(file, r: _Reader) -> dict[int, str]:
    peers = {}
    for port in list(r.table):
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(file, r.key(port), "peer keys are remote TCP ports, e.g. \"8100\" = \"inference\"")
        name = r.get(port, str, nonempty=True)
        if "=" in name or "," in name:     # the exporter reads "a=b,c=d" as several labels (model/labels.py)
            raise ConfigError(file, r.key(port), f"{name!r}: a peer's name is a label value; use no '=' or ','")
        peers[int(port)] = name
    return peers


def _control(file, r: _Reader) -> Control:
    """[control]: its kind, and the keys and targets table that kind's actuator declares
    (daemon/actuators/<kind>.py OPTIONS, TARGETS)."""
    kind = r.get("kind", str, choices=tuple(ACTUATORS))
    if kind is None:
        raise ConfigError(file, r.key("kind"), f"missing; one of {', '.join(ACTUATORS)}")
    actuator = ACTUATORS[kind]
    options = {}
    for name, o in actuator.OPTIONS.items():
        # a key with a default set empty would mean nothing, not the default: refused
        value = r.get(name, str, o.default, choices=o.choices or None, nonempty=bool(o.default))
        if o.required and not value:
            raise ConfigError(file, r.key(name), f"missing: the {kind} actuator needs {o.what}")
        if value and o.check and (why := o.check(value)):
            raise ConfigError(file, r.key(name), f"{value!r} {why}")
        options[name] = value
    targets = _targets(file, kind, r.table_of("targets"))
    if actuator.TARGETS is not None and actuator.TARGETS.required and not targets:
        raise ConfigError(file, r.key("targets"), f"missing: the {kind} actuator needs a [control.targets] table, "
                                                  f"e.g. {actuator.TARGETS.example}")
    if r.table:
        raise ConfigError(file, r.key(sorted(r.table)[0]), f"unknown key; the {kind} actuator takes kind, "
                                                           f"{', '.join(actuator.OPTIONS)}" +
                          (", targets" if actuator.TARGETS is not None else ""))
    return Control(kind, options, targets)


def _targets(file, kind: str, r: _Reader) -> dict[str, str]:
    """[control.targets]: setting -> the name or command it has on the service, checked by its actuator."""
    if r.table and ACTUATORS[kind].TARGETS is None:
        raise ConfigError(file, r.key(next(iter(r.table))), f"the {kind} actuator takes no [control.targets] table")
    out = {}
    for setting in list(r.table):
        target = r.get(setting, str, nonempty=True)
        if (why := ACTUATORS[kind].target_error(target)) is not None:
            raise ConfigError(file, r.key(setting), why)
        out[setting] = target
    return out


def _tuners(file, svc: _Reader, default_tune_s: float | None, control: Control | None,
            settings: dict[str, Bounds], service: ServiceSpec,
            elsewhere: frozenset[str] | set[str] = frozenset()) -> tuple[TunerConf, ...]:
    """The service's [tuners.NAME] tables, each read by its tuner's spec. A tuner that
    pushes needs the [control] table (unless its settings are only recommended, or go
    to a proxy: `elsewhere`), bounds for every setting it pushes, and the SLOs it steers on."""
    from slotune.tuners import TUNERS   # here: tuners/ imports scipy (drift), ~0.7 s that only load() needs
    r, out = svc.table_of("tuners"), []
    for name in list(r.table):
        if name not in TUNERS:
            raise ConfigError(file, r.key(name), f"unknown tuner; one of {', '.join(TUNERS)}")
        t, spec = r.table_of(name), TUNERS[name].SPEC
        tuner = _tuner(file, t, name, spec, TUNERS[name].INTERVAL_S if default_tune_s is None else default_tune_s)
        if control is None and not set(spec.pushes(tuner.policy)) <= elsewhere:   # (an alert-only tuner pushes none)
            raise ConfigError(file, t.where, "a tuner that pushes settings needs a [control] table")
        for setting in spec.pushes(tuner.policy):
            if setting not in settings:
                raise ConfigError(file, svc.key(f"settings.{setting}"),
                                  f"missing: tuner {name} changes it, so it needs min, max and max_step")
        for key in spec.slos:   # slo_ttft_p99_ms is read into slo_ttft_p99_s
            if getattr(service, key.removesuffix("_ms") + "_s") <= 0:
                raise ConfigError(file, svc.key(key), f"missing: tuner {name} steers on it; set it in ms")
        out.append(tuner)
    return tuple(out)


def _tuner(file, t: _Reader, name: str, spec: Spec, default_tune_s: float) -> TunerConf:
    from slotune.tuners import policy as tuner_policy   # here: as in _tuners
    policy = t.get("policy", str, "slotune")
    try:
        tuner_policy(name, policy)
    except ValueError as exc:
        raise ConfigError(file, t.key("policy"), str(exc)) from None
    interval_s = t.get("interval_s", float, default_tune_s, lo=0.5, hi=86400.0)
    options = {o.name: t.get(o.name, o.kind, o.default, lo=o.low, hi=o.high) for o in spec.options}
    if t.table:
        keys = ", ".join(["policy", "interval_s", *(f"{o.name} ({o.help})" for o in spec.options)])
        raise ConfigError(file, t.key(sorted(t.table)[0]), f"unknown key; tuner {name} takes {keys}")
    return TunerConf(name, policy, interval_s, options)


def _settings(file, r: _Reader) -> dict[str, Bounds]:
    out = {}
    for name in list(r.table):
        s = r.table_of(name)
        lo, hi = s.get("min", float), s.get("max", float)
        step = s.get("max_step", float, lo=0.0)
        if lo is None or hi is None or step is None:
            raise ConfigError(file, s.where, "needs min, max and max_step")
        if lo > hi:
            raise ConfigError(file, s.key("min"), f"min {lo} is above max {hi}")
        if step <= 0:
            raise ConfigError(file, s.key("max_step"), "must be > 0")
        out[name] = Bounds(lo, hi, step, s.get("integer", bool, False), s.get("in_force", float))
        s.done()
    return out


def _map_entries(file: Path, r: _Reader) -> dict[str, int]:
    """daemon.bpf_map_entries: entries per BPF map (collectors/kernel/program.py MAP_ENTRIES);
    a map not named keeps its default."""
    for name in r.table:
        if name not in MAP_ENTRIES:
            raise ConfigError(file, r.key(name), f"no BPF map {name!r}; known: {', '.join(MAP_ENTRIES)}")
    lo, hi = MAP_ENTRIES_RANGE
    return {name: r.get(name, int, default, lo=lo, hi=hi) for name, default in MAP_ENTRIES.items()}


def _export(file: Path, r: _Reader) -> ExportConf:
    conf = ExportConf(
        grafana_url=r.get("grafana_url", str, ""), grafana_token_file=r.get("grafana_token_file", str, ""),
        grafana_dashboard_uid=r.get("grafana_dashboard_uid", str, ""), otlp_endpoint=r.get("otlp_endpoint", str, ""),
        otlp_metrics=r.get("otlp_metrics", bool, True),
        otlp_metrics_interval_s=r.get("otlp_metrics_interval_s", float, 30.0, lo=1.0, hi=3600.0),
        buckets_per_octave=r.get("buckets_per_octave", int, 8, choices=BUCKETS_PER_OCTAVE))
    r.done()
    for key in ("grafana_url", "otlp_endpoint"):
        if getattr(conf, key) and not getattr(conf, key).startswith(("http://", "https://")):
            raise ConfigError(file, r.key(key), f"{getattr(conf, key)!r} is not an http(s) URL")
    if conf.grafana_url and not conf.grafana_token_file:
        raise ConfigError(file, r.key("grafana_token_file"), "grafana_url needs it: the file holding a Grafana "
                          "service-account token with the Editor role (Administration > Service accounts)")
    if re.search(r"/v1/(logs|metrics)/?$", conf.otlp_endpoint):
        raise ConfigError(file, r.key("otlp_endpoint"), "give the collector's base URL (e.g. http://collector:4318); "
                          "slotune adds /v1/logs and /v1/metrics itself")
    return conf


def load(path: str | Path = DEFAULT_PATH) -> Config:
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise ConfigError(path, "-", "file not found; copy slotune.example.toml there or pass --config") from None
    except IsADirectoryError:
        raise ConfigError(path, "-", "is a folder, not a file; pass the TOML file's path") from None
    except OSError as exc:
        raise ConfigError(path, "-", f"cannot read it ({exc.strerror}); check its permissions") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(path, "-", f"not UTF-8 text (byte {exc.start}); save it as UTF-8") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(path, "-", f"not valid TOML: {exc}") from None
    top = _Reader(path, "", raw)
    d = top.table_of("daemon")
    tune_s = d.get("tune_interval_s", float, None, lo=0.5, hi=86400.0)
    probes = tuple(d.get("probes", list, list(PROBE_FAMILIES)))
    for p in probes:
        if p not in PROBE_FAMILIES:
            raise ConfigError(path, "daemon.probes", f"unknown probe family {p!r}; known: {', '.join(PROBE_FAMILIES)}")
    exporter = d.get("exporter_address", str, "127.0.0.1:9477")
    if not re.fullmatch(r"[\w.\-\[\]:]*:\d{1,5}", exporter):
        raise ConfigError(path, "daemon.exporter_address", f"{exporter!r} is not HOST:PORT")
    audit_log = d.get("audit_log", str, Config.audit_log, nonempty=True)
    cfg = dict(
        path=str(path),
        collect_interval_s=d.get("collect_interval_s", float, 1.0, lo=0.1, hi=60.0),
        tune_interval_s=tune_s,
        exporter_address=exporter,
        baseline_store=d.get("baseline_store", str, Config.baseline_store, nonempty=True),
        baseline_retention_days=d.get("baseline_retention_days", float, 35.0, lo=1.0, hi=3650.0),
        audit_log=audit_log,
        # beside the audit log unless set: two daemons (or a demo and a test) never share guards
        state_file=d.get("state_file", str, str(Path(audit_log).parent / "state.json"), nonempty=True),
        environment=d.get("environment", str, "production", nonempty=True),
        deploy_id=d.get("deploy_id", str, "") or os.environ.get("SLOTUNE_DEPLOY_ID", "unknown"),
        dry_run=d.get("dry_run", bool, False),
        prometheus_url=d.get("prometheus_url", str, ""),
        baseline_source=d.get("baseline_source", str, "local", choices=BASELINE_SOURCES),
        probes=probes,
        bpf_map_entries=_map_entries(path, d.table_of("bpf_map_entries")),
    )
    d.done()
    if cfg["baseline_source"] == "prometheus" and not cfg["prometheus_url"].startswith(("http://", "https://")):
        raise ConfigError(path, "daemon.baseline_source", '"prometheus" needs daemon.prometheus_url, the http(s) '
                          'URL of the Prometheus to read baselines from (or baseline_source = "local")')
    export = _export(path, top.table_of("export"))
    services_table = top.table_of("services")
    services = tuple(_service(path, name, services_table.table_of(name), tune_s) for name in list(services_table.table))
    if not services:
        raise ConfigError(path, "services", "no services declared; add a [services.NAME] table")
    names = {s.name for s in services}
    for svc in services:
        for dep in svc.downstream:
            if dep not in names:
                raise ConfigError(path, f"services.{svc.name}.downstream", f"{dep!r} is not a declared service")
        if svc.admission_by:
            _admission(path, svc, {s.name: s for s in services})
    top.done()
    return Config(services=services, export=export, **cfg)
