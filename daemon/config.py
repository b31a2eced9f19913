"""The daemon's TOML configuration: parsed once, checked completely, and refused
with the file, the key and the reason when anything is unknown or out of range.
`slotune.example.toml` at the repo root documents every key."""
from __future__ import annotations

import os
import re
import signal
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from daemon.model.service import ServiceSpec

DEFAULT_PATH = Path("/etc/slotune/slotune.toml")
# Which settings each tuner's policies change; they need bounds in the config.
TUNER_SETTINGS = {
    "throttle": ("concurrency_limit",),
    "batch": ("max_batch_size", "max_queue_delay_ms"),
    "sampling": ("trace_sample_rate", "trace_keep_slower_than_s"),
    "breaker": ("breaker_failure_threshold", "breaker_consecutive_failures", "breaker_open_s"),
    "drift": (),
}
POLICY_SETTINGS = {("throttle", "whitepaper"): ("rate_limit_rps",)}
PROBE_FAMILIES = ("runqueue", "offcpu", "tcp", "tls", "http")
ACTUATOR_KINDS = ("reference", "http-json", "file")


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


@dataclass(frozen=True)
class Control:
    kind: str
    url: str = ""
    token_file: str = ""
    method: str = "PATCH"
    path: str = ""          # file actuator: the settings file
    pid_file: str = ""      # file actuator: process to signal after a write
    signal: str = ""


@dataclass(frozen=True)
class TunerConf:
    name: str
    policy: str
    interval_s: float
    budget_traces_per_s: float = 10.0    # sampling: traces/s to keep
    slo_failure_rate: float = 0.003      # breaker: a tool's failure-rate objective
    baseline_days: float = 7.0           # drift: how far back the baseline reaches


@dataclass(frozen=True)
class ServiceConf:
    spec: ServiceSpec
    latency_metric: str = ""
    downstream: tuple[str, ...] = ()
    control: Control | None = None
    tuners: tuple[TunerConf, ...] = ()
    settings: dict[str, Bounds] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.spec.name


@dataclass(frozen=True)
class Config:
    path: str
    collect_interval_s: float = 1.0
    tune_interval_s: float = 30.0
    exporter_address: str = "127.0.0.1:9477"
    baseline_store: str = "/var/lib/slotune/baselines.sqlite"
    audit_log: str = "/var/lib/slotune/audit.jsonl"
    environment: str = "production"
    deploy_id: str = "unknown"
    dry_run: bool = False
    prometheus_url: str = ""
    probes: tuple[str, ...] = PROBE_FAMILIES
    services: tuple[ServiceConf, ...] = ()

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


def signal_number(name: str) -> int | None:
    """HUP, SIGHUP, hup -> signal.SIGHUP; None when there is no such signal."""
    found = getattr(signal, "SIG" + name.upper().removeprefix("SIG"), None)
    return int(found) if isinstance(found, signal.Signals) else None


class _Reader:
    """Pops keys from one TOML table so that whatever is left over is unknown."""

    def __init__(self, file: Path, where: str, table: dict):
        if not isinstance(table, dict):
            raise ConfigError(file, where, f"must be a table, got {type(table).__name__}")
        self.file, self.where, self.table = file, where, dict(table)

    def key(self, name: str) -> str:
        return f"{self.where}.{name}" if self.where else name

    def get(self, name, kind, default=None, lo=None, hi=None, choices=None):
        if name not in self.table:
            return default
        value = self.table.pop(name)
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            raise ConfigError(self.file, self.key(name), f"must be {kind.__name__}, got {value!r}")
        if lo is not None and value < lo or hi is not None and value > hi:
            raise ConfigError(self.file, self.key(name), f"{value!r} is outside {lo}..{hi}")
        if choices is not None and value not in choices:
            raise ConfigError(self.file, self.key(name), f"{value!r} is not one of {', '.join(choices)}")
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


def _service(file: Path, name: str, r: _Reader, default_tune_s: float) -> ServiceConf:
    metrics_url = r.get("metrics_url", str, "")
    spec = ServiceSpec(
        name=name,
        metrics_url=metrics_url,
        systemd_unit=r.get("systemd_unit", str),
        cgroup=r.get("cgroup", str),
        cmdline=_regex(file, r.key("cmdline"), r.get("cmdline", str)),
        port=r.get("port", int, lo=1, hi=65535),
        slo_p99_s=r.get("slo_p99_ms", float, 500.0, lo=0.1, hi=600_000.0) / 1000.0,
        peers=_peers(file, r.table_of("peers")),
    )
    if not any((spec.systemd_unit, spec.cgroup, spec.cmdline, spec.port)):
        raise ConfigError(file, r.where, "needs at least one of systemd_unit, cgroup, cmdline, port to find its processes")
    latency_metric = r.get("latency_metric", str, "")
    if latency_metric and not metrics_url:
        raise ConfigError(file, r.key("latency_metric"), "needs metrics_url to read it from")
    downstream = tuple(r.get("downstream", list, []))
    control = _control(file, r.table_of("control")) if "control" in r.table else None
    tuners = _tuners(file, r.table_of("tuners"), default_tune_s)
    settings = _settings(file, r.table_of("settings"))
    for tuner in tuners:
        if tuner.name != "drift" and control is None:
            raise ConfigError(file, r.key(f"tuners.{tuner.name}"), "a tuner that pushes settings needs a [control] table")
        for setting in POLICY_SETTINGS.get((tuner.name, tuner.policy), TUNER_SETTINGS[tuner.name]):
            if setting not in settings:
                raise ConfigError(file, r.key(f"settings.{setting}"),
                                  f"missing: tuner {tuner.name} changes it, so it needs min, max and max_step")
    r.done()
    return ServiceConf(spec, latency_metric, downstream, control, tuners, settings)


def _peers(file, r: _Reader) -> dict[int, str]:
    peers = {}
    for port in list(r.table):
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(file, r.key(port), "peer keys are remote TCP ports, e.g. \"8100\" = \"inference\"")
        peers[int(port)] = r.get(port, str)
    return peers


def _control(file, r: _Reader) -> Control:
    kind = r.get("kind", str, choices=ACTUATOR_KINDS)
    if kind is None:
        raise ConfigError(file, r.key("kind"), f"missing; one of {', '.join(ACTUATOR_KINDS)}")
    control = Control(kind=kind, url=r.get("url", str, ""), token_file=r.get("token_file", str, ""),
                      method=r.get("method", str, "PATCH", choices=("PATCH", "POST", "PUT")),
                      path=r.get("path", str, ""), pid_file=r.get("pid_file", str, ""),
                      signal=r.get("signal", str, ""))
    if kind in ("reference", "http-json") and not control.url.startswith(("http://", "https://")):
        raise ConfigError(file, r.key("url"), f"the {kind} actuator needs an http(s) URL")
    if kind == "file" and not control.path:
        raise ConfigError(file, r.key("path"), "the file actuator needs the settings file path")
    if control.signal and signal_number(control.signal) is None:
        raise ConfigError(file, r.key("signal"), f"unknown signal {control.signal!r}; use e.g. HUP or USR1")
    r.done()
    return control


def _tuners(file, r: _Reader, default_tune_s: float) -> tuple[TunerConf, ...]:
    out = []
    for name in list(r.table):
        if name not in TUNER_SETTINGS:
            raise ConfigError(file, r.key(name), f"unknown tuner; one of {', '.join(TUNER_SETTINGS)}")
        t = r.table_of(name)
        policy = t.get("policy", str, "slotune")
        _check_policy(file, t.key("policy"), name, policy)
        out.append(TunerConf(
            name, policy, t.get("interval_s", float, default_tune_s, lo=0.5, hi=86400.0),
            budget_traces_per_s=t.get("budget_traces_per_s", float, 10.0, lo=0.001, hi=1e6) if name == "sampling" else 10.0,
            slo_failure_rate=t.get("slo_failure_rate", float, 0.003, lo=0.0, hi=1.0) if name == "breaker" else 0.003,
            baseline_days=t.get("baseline_days", float, 7.0, lo=0.001, hi=365.0) if name == "drift" else 7.0))
        t.done()
    return tuple(out)


def _check_policy(file, key, tuner, policy):
    import tuners
    try:
        tuners.policy(tuner, policy)
    except ValueError as exc:
        raise ConfigError(file, key, str(exc)) from None


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
        out[name] = Bounds(lo, hi, step, s.get("integer", bool, False))
        s.done()
    return out


def load(path: str | Path = DEFAULT_PATH) -> Config:
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(path, "-", "file not found; copy slotune.example.toml there or pass --config") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(path, "-", f"not valid TOML: {exc}") from None
    top = _Reader(path, "", raw)
    d = top.table_of("daemon")
    tune_s = d.get("tune_interval_s", float, 30.0, lo=0.5, hi=86400.0)
    probes = tuple(d.get("probes", list, list(PROBE_FAMILIES)))
    for p in probes:
        if p not in PROBE_FAMILIES:
            raise ConfigError(path, "daemon.probes", f"unknown probe family {p!r}; known: {', '.join(PROBE_FAMILIES)}")
    exporter = d.get("exporter_address", str, "127.0.0.1:9477")
    if not re.fullmatch(r"[\w.\-\[\]:]*:\d{1,5}", exporter):
        raise ConfigError(path, "daemon.exporter_address", f"{exporter!r} is not HOST:PORT")
    cfg = dict(
        path=str(path),
        collect_interval_s=d.get("collect_interval_s", float, 1.0, lo=0.1, hi=60.0),
        tune_interval_s=tune_s,
        exporter_address=exporter,
        baseline_store=d.get("baseline_store", str, Config.baseline_store),
        audit_log=d.get("audit_log", str, Config.audit_log),
        environment=d.get("environment", str, "production"),
        deploy_id=d.get("deploy_id", str, "") or os.environ.get("SLOTUNE_DEPLOY_ID", "unknown"),
        dry_run=d.get("dry_run", bool, False),
        prometheus_url=d.get("prometheus_url", str, ""),
        probes=probes,
    )
    d.done()
    services_table = top.table_of("services")
    services = tuple(_service(path, name, services_table.table_of(name), tune_s) for name in list(services_table.table))
    if not services:
        raise ConfigError(path, "services", "no services declared; add a [services.NAME] table")
    names = {s.name for s in services}
    for svc in services:
        for dep in svc.downstream:
            if dep not in names:
                raise ConfigError(path, f"services.{svc.name}.downstream", f"{dep!r} is not a declared service")
    top.done()
    return Config(services=services, **cfg)
