"""The control loop: runs each service's tuners at their interval on the
windows since their last decision, and pushes what they decide through the
service's actuator behind the guards — bounds, largest step, one change per
setting per interval, rollback when the SLO gets worse, back-off when the
control surface is down, and dry-run. Every decision goes to the audit log."""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field, replace

from daemon.control import observations
from daemon.control.actuators import Actuator, ActuatorError
from daemon.control.audit import AuditLog, Entry, Outcome
from daemon.control.tuner_specs import SPECS, Alert
from daemon.config import Bounds, Config, ServiceConf
from daemon.model.window import Window, merged_latency

log = logging.getLogger(__name__)
ROLLBACK_WORSE = 1.25      # P99 this much worse than before the change ...
LOAD_CHANGED = 1.25        # ... under an offered load within this factor of before
HOLD_INTERVALS = 3         # a rolled-back setting is left alone this many intervals,
MAX_HOLD_S = 3600.0        # doubling with each rollback up to an hour
MAX_BACKOFF_S = 60.0


def guarded(value: float, old: float | None, bounds: Bounds) -> float:
    """The value actually pushed: within the largest step of the old value, then within bounds."""
    if old is not None and math.isfinite(old):
        value = min(max(value, old - bounds.max_step), old + bounds.max_step)
    value = min(max(value, bounds.min), bounds.max)
    return float(round(value)) if bounds.integer else value


@dataclass
class Pending:
    """A pushed change waiting to be judged against the windows before it."""
    tuner: str
    setting: str
    old: float
    new: float
    t: float
    interval_s: float
    before_p99: float
    before_load: float


@dataclass
class ServiceControl:
    conf: ServiceConf
    actuator: Actuator | None
    settings: dict[str, float] = field(default_factory=dict)
    states: dict[str, object] = field(default_factory=dict)
    last_decision: dict[str, float] = field(default_factory=dict)
    last_change: dict[str, float] = field(default_factory=dict)
    held_until: dict[str, float] = field(default_factory=dict)
    rollbacks: dict[str, int] = field(default_factory=dict)
    stopped: set[str] = field(default_factory=set)     # tuners that cannot run on this service

    @property
    def control_ok(self) -> bool:
        """False while the service has a control surface that does not answer."""
        return self.reachable or self.actuator is None
    pending: list[Pending] = field(default_factory=list)
    retry_at: float = 0.0
    backoff_s: float = 1.0
    reachable: bool = False


def merged_p99(windows: list[Window]) -> tuple[float, float]:
    """(P99 over the windows' latency merged, offered load in requests/s)."""
    seconds = sum(w.seconds for w in windows)
    offered = sum(w.requests + w.rejected for w in windows)
    hist = merged_latency(windows)
    p99 = hist.quantile(0.99) if hist is not None else math.nan
    return p99, offered / seconds if seconds else 0.0


class ControlLoop:
    def __init__(self, cfg: Config, actuators: dict[str, Actuator], audit: AuditLog, dry_run: bool,
                 baseline_for=lambda service, since, until: None):
        self.audit, self.dry_run = audit, dry_run
        self.baseline_for = baseline_for   # (service, since, until) -> tuners.drift.Baseline | None
        self.services = {s.name: ServiceControl(s, actuators.get(s.name)) for s in cfg.services}
        # (service, metric) -> (change against the baseline, alert on) of the alert-only tuners
        self.drift: dict[tuple[str, str], tuple[float, bool]] = {}

    def reconfigure(self, cfg: Config, actuators: dict[str, Actuator]) -> None:
        """Keep tuner state for services and tuners that survive a reload with the same
        policy; a tuner whose policy changed starts fresh (one policy's state means
        nothing to another)."""
        old = self.services
        self.services = {}
        for s in cfg.services:
            if s.name not in old:
                self.services[s.name] = ServiceControl(s, actuators.get(s.name))
                continue
            was = {t.name: t.policy for t in old[s.name].conf.tuners}
            states = {name: state for name, state in old[s.name].states.items()
                      if any(t.name == name and t.policy == was.get(name) for t in s.tuners)}
            self.services[s.name] = replace(old[s.name], conf=s, actuator=actuators.get(s.name), stopped=set(),
                                            states=states)

    def tick(self, now: float, history: dict[str, list[Window]]) -> list[Entry]:
        entries: list[Entry] = []
        for sc in self.services.values():
            if not sc.conf.tuners:
                continue
            due = [t for t in sc.conf.tuners if t.name not in sc.stopped
                   and now - sc.last_decision.get(t.name, -math.inf) >= t.interval_s]
            judging = any(now - p.t >= p.interval_s for p in sc.pending)
            if not (due or judging):
                continue
            windows = history.get(sc.conf.name, [])
            if sc.actuator is not None and not self._refresh(sc, now):
                continue
            entries += self._judge(sc, now, windows)
            for tconf in due:
                since = sc.last_decision.get(tconf.name, now - tconf.interval_s)
                sc.last_decision[tconf.name] = now
                recent = [w for w in windows if w.end > since]
                if recent:
                    entries += self._decide(sc, tconf, now, recent, windows)
        return entries

    def _refresh(self, sc: ServiceControl, now: float) -> bool:
        """Read the live settings; on failure back off (1 s doubling to 60 s) and say so once."""
        if now < sc.retry_at:
            return False
        try:
            sc.settings.update(sc.actuator.current())
            if not sc.reachable:
                log.info("service %s: control surface reachable", sc.conf.name)
            sc.reachable, sc.backoff_s = True, 1.0
            return True
        except ActuatorError as exc:
            if sc.reachable or sc.retry_at == 0.0:
                log.warning("service %s: control surface down (%s); observing only, retrying with back-off",
                            sc.conf.name, exc)
            sc.reachable = False
            sc.retry_at = now + sc.backoff_s
            sc.backoff_s = min(sc.backoff_s * 2, MAX_BACKOFF_S)
            return False

    def _decide(self, sc: ServiceControl, tconf, now: float, recent: list[Window],
                all_windows: list[Window]) -> list[Entry]:
        spec = SPECS[tconf.name]
        inputs = observations.Inputs(now, recent, all_windows, sc.conf, spec.option_values(tconf.options),
                                     tconf.interval_s, self.baseline_for)
        obs = spec.observe(inputs)
        if obs is None:
            return []
        policy = spec.policy(tconf.policy)
        try:
            if tconf.name not in sc.states:
                sc.states[tconf.name] = policy.initial_state(dict(sc.settings))
            sc.states[tconf.name], decision = policy.decide(sc.states[tconf.name], obs)
        except ValueError as exc:   # e.g. the service has no such setting: stop this tuner, keep the rest
            log.error("service %s: tuner %s stopped: %s", sc.conf.name, tconf.name, exc)
            sc.stopped.add(tconf.name)
            entry = Entry(now, sc.conf.name, tconf.name, "-", None, None, str(exc), Outcome.REFUSED, "tuner stopped")
            self.audit.write(entry)
            return [entry]
        if spec.alert is not None:
            return self._alert(sc, spec.name, spec.alert, now, obs, decision)
        changes = spec.to_settings(decision.changes, inputs) if spec.to_settings else decision.changes
        entries = [self._apply(sc, tconf, now, setting, wanted, decision.reason, recent)
                   for setting, wanted in changes.items()]
        entries = [e for e in entries if e is not None]
        for entry in entries:
            self.audit.write(entry)
        return entries

    def _alert(self, sc: ServiceControl, tuner: str, alert: Alert, now: float, obs, decision) -> list[Entry]:
        """An alert-only tuner pushes nothing: it raises or clears an alert, exported and audited when it changes."""
        key = (sc.conf.name, alert.metric)
        baseline, value = alert.reading(obs)
        deviation = value / baseline - 1.0 if baseline > 0 else 0.0
        was = self.drift.get(key, (0.0, False))[1]
        self.drift[key] = (deviation, decision.alert)
        if decision.alert == was:
            return []
        entry = Entry(now, sc.conf.name, tuner, alert.metric, baseline, value, decision.reason,
                      Outcome.ALERT_RAISED if decision.alert else Outcome.ALERT_CLEARED)
        self.audit.write(entry)
        return [entry]

    def _apply(self, sc, tconf, now, setting, wanted, reason, recent) -> Entry | None:
        bounds = sc.conf.settings.get(setting)
        old = sc.settings.get(setting)
        if bounds is None:
            return Entry(now, sc.conf.name, tconf.name, setting, old, wanted, reason,
                         Outcome.REFUSED, "no bounds for this setting in the config")
        new = guarded(float(wanted), old, bounds)
        if old is not None and math.isclose(new, old, rel_tol=1e-9, abs_tol=1e-12):
            return None
        if now < sc.held_until.get(setting, -math.inf):
            return Entry(now, sc.conf.name, tconf.name, setting, old, new, reason, Outcome.HELD, "rolled back recently")
        if now - sc.last_change.get(setting, -math.inf) < tconf.interval_s:
            return Entry(now, sc.conf.name, tconf.name, setting, old, new, reason, Outcome.HELD, "changed this interval")
        note = "" if new == wanted else f" (tuner wanted {wanted:g})"
        if self.dry_run or sc.actuator is None:
            return Entry(now, sc.conf.name, tconf.name, setting, old, new, reason + note, Outcome.DRY_RUN)
        try:
            sc.actuator.push({setting: new})
        except ActuatorError as exc:
            if exc.unreachable:
                sc.reachable, sc.retry_at = False, now + sc.backoff_s
            return Entry(now, sc.conf.name, tconf.name, setting, old, new, reason + note, Outcome.PUSH_FAILED, str(exc))
        sc.settings[setting] = new
        sc.last_change[setting] = now
        p99, load = merged_p99(recent)
        if old is not None and math.isfinite(p99):
            sc.pending.append(Pending(tconf.name, setting, old, new, now, tconf.interval_s, p99, load))
        return Entry(now, sc.conf.name, tconf.name, setting, old, new, reason + note, Outcome.PUSHED)

    def _judge(self, sc: ServiceControl, now: float, windows: list[Window]) -> list[Entry]:
        """Roll back a change whose next interval has a clearly worse P99 under a similar load."""
        entries, still = [], []
        for p in sc.pending:
            if now - p.t < p.interval_s:
                still.append(p)
                continue
            after = [w for w in windows if w.start >= p.t]
            p99, load = merged_p99(after)
            similar = load <= p.before_load * LOAD_CHANGED
            worse = math.isfinite(p99) and p99 > max(p.before_p99 * ROLLBACK_WORSE, sc.conf.spec.slo_p99_s)
            why = (f"P99 {p99 * 1e3:.0f} ms after the change vs {p.before_p99 * 1e3:.0f} ms before, "
                   f"load {load:.1f}/s vs {p.before_load:.1f}/s")
            if not (worse and similar):
                entry = Entry(now, sc.conf.name, p.tuner, p.setting, p.old, p.new, why, Outcome.KEPT,
                              "load changed too much to judge" if worse else "")
                self.audit.write(entry)
                entries.append(entry)
                continue
            outcome, detail = Outcome.ROLLED_BACK, ""
            try:
                if not self.dry_run:
                    sc.actuator.push({p.setting: p.old})
                sc.settings[p.setting] = p.old
            except ActuatorError as exc:
                outcome, detail = Outcome.ROLLBACK_FAILED, str(exc)
            sc.last_change[p.setting] = now
            sc.rollbacks[p.setting] = sc.rollbacks.get(p.setting, 0) + 1
            hold = HOLD_INTERVALS * p.interval_s * 2 ** (sc.rollbacks[p.setting] - 1)
            sc.held_until[p.setting] = now + min(hold, MAX_HOLD_S)
            entry = Entry(now, sc.conf.name, p.tuner, p.setting, p.new, p.old, why, outcome, detail)
            self.audit.write(entry)
            entries.append(entry)
        sc.pending = still
        return entries
