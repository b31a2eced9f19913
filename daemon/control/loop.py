"""The control loop: runs each service's tuners at their interval on the
Interval's windows since their last decision, and pushes what they decide
through the service's actuator behind the guards — finite values only, bounds,
largest step, one change per setting per interval, a decision pushed whole or
not at all, rollback when the SLO gets worse (retried until it lands),
back-off when the control surface is down, and dry-run (which stops new
changes, not the rollbacks owed for slotune's own). Each service runs in its
bulkhead: whatever one service's answers make happen stays that service's. Every
decision is in the audit log, and its judgement owed, before it is pushed; the
guards' memory survives a restart. The settings in force are read back when a
tuner is due, at most every REFRESH_S, and again just before anything is pushed:
a decision taken on settings that have changed since is not pushed, the tuner
decides again on what is in force."""
from __future__ import annotations

import logging
import math
from concurrent import futures
from dataclasses import dataclass, field, replace
from functools import partial

from slotune.tuners.base import Alert

from slotune.config import Bounds, Config, ServiceConf
from slotune.control import observations
from slotune.actuators import Actuator, ActuatorError, plain
from slotune.store.audit import AuditError, AuditLog, Entry, Outcome
from slotune.control.guard_state import GuardState
from slotune.control.tuner_specs import SPECS
from slotune.host.bulkheads import Bulkheads
from slotune.model.interval import Interval

log = logging.getLogger(__name__)
ROLLBACK_WORSE = 1.25      # P99 this much worse than before the change ...
LOAD_CHANGED = 1.25        # ... under an offered load within this factor of before
JUDGE_WAIT_INTERVALS = 3   # a change with no request answered since waits this many intervals to be judged
HOLD_INTERVALS = 3         # a rolled-back setting is left alone this many intervals,
MAX_HOLD_S = 3600.0        # doubling with each rollback up to an hour
MAX_BACKOFF_S = 60.0
REFRESH_S = 5.0            # the settings in force are read at most this often, unless about to push
READERS = 16               # control surfaces read at once
READ_WAIT_S = 0.25         # how long a tick waits for them (a healthy one answers in milliseconds)


def guarded(value: float, old: float | None, bounds: Bounds) -> float:
    """The value actually pushed: within the largest step of the old value, then within bounds."""
    if old is not None and math.isfinite(old):
        value = min(max(value, old - bounds.max_step), old + bounds.max_step)
    value = min(max(value, bounds.min), bounds.max)
    return float(round(value)) if bounds.integer else value


@dataclass
class ServiceControl:
    conf: ServiceConf
    actuator: Actuator | None
    guard: GuardState = field(default_factory=GuardState)   # what survives a restart
    settings: dict[str, float] = field(default_factory=dict)  # in force, as last read back
    states: dict[str, object] = field(default_factory=dict)
    last_decision: dict[str, float] = field(default_factory=dict)
    stopped: set[str] = field(default_factory=set)     # tuners that cannot run on this service
    recommended: dict[str, float] = field(default_factory=dict)   # restart-only settings, as last recommended
    retry_at: float = 0.0
    backoff_s: float = 1.0
    reachable: bool = False
    read_at: float = -math.inf     # when the settings in force were last read back

    @property
    def control_ok(self) -> bool:
        """False while the service has a control surface that does not answer."""
        return self.reachable or self.actuator is None


class ControlLoop:
    def __init__(self, cfg: Config, actuators: dict[str, Actuator], audit: AuditLog, dry_run: bool,
                 baseline_for=lambda service, since, until: None, guards: dict[str, GuardState] | None = None,
                 bulkheads: Bulkheads | None = None, before_push=lambda: None, after_push=lambda: None):
        self.audit, self.dry_run = audit, dry_run
        self.baseline_for = baseline_for   # (service, since, until) -> tuners.drift.Baseline | None
        self.bulkheads = bulkheads or Bulkheads()
        self.tick_s = cfg.collect_interval_s   # time is counted in ticks: see _passed
        self.readers = futures.ThreadPoolExecutor(READERS, thread_name_prefix="control-read")
        self.reading: dict[str, futures.Future] = {}    # service -> its read of the settings in force, going on
        # before_push(): the pending judgement is saved and the watchdog told; after_push() once it is over
        self.before_push, self.after_push = before_push, after_push
        guards = guards or {}
        # a service with admission_by is pushed through its proxy's surface
        self.services = {s.name: ServiceControl(s, actuators.get(s.admission_by or s.name),
                                                guards.get(s.name, GuardState()))
                         for s in cfg.services}
        # (service, metric) -> (change against the baseline, alert on) of the alert-only tuners
        self.drift: dict[tuple[str, str], tuple[float, bool]] = {}
        self.audit_failures = 0

    def reconfigure(self, cfg: Config, actuators: dict[str, Actuator], now: float) -> list[Entry]:
        """Keep tuner state for services and tuners that survive a reload with the same
        policy; a tuner whose policy changed starts fresh (one policy's state means
        nothing to another). A service the new config drops has every change still
        being judged put back first: nobody would judge it after."""
        old, entries = self.services, []
        new = {s.name: s for s in cfg.services}
        for name, sc in old.items():
            if name not in new:
                entries += self._put_back_pending(sc, now, "the service left the config while the change was "
                                                  "being judged")
            elif new[name].control != sc.conf.control:
                entries += self._put_back_pending(sc, now, "its control surface changed in the config while the "
                                                  "change was being judged")
        self.services = {}
        for s in cfg.services:
            if s.name not in old:
                self.services[s.name] = ServiceControl(s, actuators.get(s.admission_by or s.name))
                continue
            was = {t.name: t.policy for t in old[s.name].conf.tuners}
            states = {name: state for name, state in old[s.name].states.items()
                      if any(t.name == name and t.policy == was.get(name) for t in s.tuners)}
            self.services[s.name] = replace(old[s.name], conf=s, actuator=actuators.get(s.admission_by or s.name),
                                            stopped=set(), states=states)
        self.bulkheads.forget(set(self.services))
        self.reading = {name: read for name, read in self.reading.items() if name in self.services}
        self.tick_s = cfg.collect_interval_s
        return entries

    def _put_back_pending(self, sc: ServiceControl, now: float, why: str) -> list[Entry]:
        entries: list[Entry] = []
        for p in list(sc.guard.pending) if sc.actuator is not None else []:
            p.rollback, p.why = True, p.why or why
            entries += self.bulkheads.run(sc.conf.name, "decide", partial(self._roll_back, sc, p, now), [])
        return entries

    def guards(self) -> dict[str, GuardState]:
        return {name: sc.guard for name, sc in self.services.items()}

    def tick(self, interval: Interval) -> list[Entry]:
        """Each service's judgements and decisions, each service in its bulkhead. The settings
        in force are read from every service that needs them at once, on threads; the tick
        waits READ_WAIT_S for them: a surface slower than that (one that hangs until its
        deadline) is left reading, and its service decides in the first tick after the read
        ends, so that it never holds the others."""
        now, entries = interval.end, list[Entry]()
        wanted = [sc for sc in self.services.values()
                  if sc.conf.tuners and (self._due(sc, now) or self._judging(sc, now))]
        for sc in wanted:
            if sc.actuator is not None and sc.conf.name not in self.reading and self._stale(sc, now):
                self.reading[sc.conf.name] = self.readers.submit(sc.actuator.current)
        futures.wait([self.reading[sc.conf.name] for sc in wanted if sc.conf.name in self.reading],
                     timeout=READ_WAIT_S)
        for sc in wanted:
            read = self.reading.get(sc.conf.name)
            if read is not None and not read.done():
                continue          # still reading: decided once the read ends
            if read is not None:
                del self.reading[sc.conf.name]
                in_force = self.bulkheads.run(sc.conf.name, "read", partial(self._took, sc, now, read.result), False)
            else:          # read lately (reachable), or backed off (not): no read was due
                in_force = sc.control_ok
            if in_force:
                entries += self.bulkheads.run(sc.conf.name, "decide", partial(self._tick, sc, interval), [])
        return entries

    def _stale(self, sc: ServiceControl, now: float) -> bool:
        """Whether the settings in force are to be read now (not backed off, not read lately)."""
        return now >= sc.retry_at and not (sc.reachable and now - sc.read_at < REFRESH_S)

    def close(self) -> None:
        self.readers.shutdown(wait=False, cancel_futures=True)

    def _due(self, sc: ServiceControl, now: float) -> list:
        return [t for t in sc.conf.tuners if t.name not in sc.stopped
                and self._passed(now, sc.last_decision.get(t.name, -math.inf), t.interval_s)]

    def _judging(self, sc: ServiceControl, now: float) -> bool:
        return any(self._passed(now, p.t, p.interval_s) for p in sc.guard.pending) or sc.guard.rollbacks_owed

    def _tick(self, sc: ServiceControl, interval: Interval) -> list[Entry]:
        """The service's judgements and decisions, on the settings in force just read."""
        now, entries, name = interval.end, list[Entry](), sc.conf.name
        due = self._due(sc, now)
        for setting in sc.conf.recommend:    # restart-only: in force is what it was started with
            started_with = sc.conf.settings[setting].in_force
            assert started_with is not None, "config.load refuses a restart-only setting without in_force"
            sc.settings.setdefault(setting, started_with)
        entries += self._judge(sc, interval)
        for tconf in due:
            since = sc.last_decision.get(tconf.name, now - tconf.interval_s)
            sc.last_decision[tconf.name] = now
            recent = interval.since(name, since)
            if recent.windows:
                at_proxy = interval.since(sc.conf.admission_by, since) if sc.conf.admission_by else None
                entries += self._decide(sc, tconf, interval, recent, at_proxy)
        return entries

    def _passed(self, now: float, since: float, interval_s: float) -> bool:
        """Whether interval_s has passed since `since`, both counted in whole ticks (each rounded
        to the nearest): a tick is stamped when it begins, a little after its time and by a
        varying amount, so two ticks 1 s apart can read 0.7 s apart; counted in seconds, a 1 s
        tuner on 1 s ticks skipped those (27-37 decisions in 50 ticks) and a 2 s one decided
        every 3 s. A tuner of interval_s decides every round(interval_s / tick) ticks, at least 1;
        half a tick or less is no tick."""
        if since == -math.inf:
            return True
        ticks = math.ceil((now - since) / self.tick_s - 0.5)
        return ticks >= max(1, math.floor(interval_s / self.tick_s + 0.5))

    def _refresh(self, sc: ServiceControl, now: float, fresh: bool = False) -> bool:
        """Read the live settings (unless read less than REFRESH_S ago and not `fresh`);
        on failure back off (1 s doubling to 60 s) and say so once; `fresh` reads through the back-off."""
        if now < sc.retry_at and not fresh:
            return False
        if sc.reachable and not fresh and now - sc.read_at < REFRESH_S:
            return True
        assert sc.actuator is not None, "only a service with an actuator has settings to read"
        return self._took(sc, now, sc.actuator.current)

    def _took(self, sc: ServiceControl, now: float, read) -> bool:
        """What read() gives (the settings in force) taken in, or the back-off on its ActuatorError."""
        try:
            sc.settings.update(read())
        except ActuatorError as exc:
            self._back_off(sc, now, exc)
            return False
        sc.read_at = now
        if not sc.reachable:
            log.info("service %s: control surface reachable", sc.conf.name)
        sc.reachable, sc.backoff_s = True, 1.0
        sc.guard.remember_originals(sc.settings, sc.conf.settings)
        return True

    def _back_off(self, sc: ServiceControl, now: float, exc: ActuatorError) -> None:
        if sc.reachable or sc.retry_at == 0.0:
            log.warning("service %s: control surface down (%s); observing only, retrying with back-off",
                        sc.conf.name, exc)
        sc.reachable = False
        sc.retry_at = now + sc.backoff_s
        sc.backoff_s = min(sc.backoff_s * 2, MAX_BACKOFF_S)

    def _decide(self, sc: ServiceControl, tconf, interval: Interval, recent, at_proxy=None) -> list[Entry]:
        now, spec = interval.end, SPECS[tconf.name]
        inputs = observations.Inputs(now, list(recent.windows), list(interval.windows(sc.conf.name)), sc.conf,
                                     spec.option_values(tconf.options), tconf.interval_s, self.baseline_for,
                                     recent, dict(sc.settings),
                                     frozenset(t.name for t in sc.conf.tuners) - sc.stopped, at_proxy)
        obs = spec.observe(inputs)
        if obs is None:
            return []
        policy = spec.policy(tconf.policy)
        try:
            if tconf.name not in sc.states:
                sc.states[tconf.name] = policy.initial_state(dict(sc.settings))
            state = policy.resync(sc.states[tconf.name], self._to_resync(sc, policy, sc.states[tconf.name]))
            sc.states[tconf.name], decision = policy.decide(state, obs)
        except ValueError as exc:   # e.g. the service has no such setting: stop this tuner, keep the rest
            log.error("service %s: tuner %s stopped: %s", sc.conf.name, tconf.name, exc)
            sc.stopped.add(tconf.name)
            entry = Entry(now, sc.conf.name, tconf.name, "-", None, None, str(exc), Outcome.REFUSED, "tuner stopped")
            return self._audit([entry])
        if spec.alert is not None:
            return self._alert(sc, spec.name, spec.alert, now, obs, decision)
        changes = spec.to_settings(decision.changes, inputs) if spec.to_settings else decision.changes
        return self._apply(sc, tconf, now, changes, decision.reason, recent)

    @staticmethod
    def _to_resync(sc: ServiceControl, policy, state) -> dict[str, float]:
        """The settings in force that the tuner's state does not hold: it steers from those
        (no wind-up against a bound, a hold or a dry run). A value the state holds that the
        guard turns into the one in force (48.6 for a whole 49) is its finer reading, kept,
        or small steps on a whole-number setting would never add up."""
        out = {}
        for setting, value in sc.settings.items():
            held, bounds = policy.held(state, setting), sc.conf.settings.get(setting)
            if held is None or bounds is None:
                continue
            if not (bounds.min <= held <= bounds.max and guarded(held, None, bounds) == value):
                out[setting] = value
        return out

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
        return self._audit([entry])

    def _plan(self, sc, tconf, now, changes: dict[str, float], reason: str) -> tuple[list[Entry], Outcome | None, str]:
        """Every setting of the decision as it would be pushed, and what stops the whole
        decision if anything does (one refused or held setting holds all: never a mix)."""
        planned, stop, why = [], None, ""
        for setting, wanted in changes.items():
            bounds, old = sc.conf.settings.get(setting), sc.settings.get(setting)
            if bounds is None:
                stop, why = Outcome.REFUSED, f"no bounds for {setting} in the config"
                new = wanted
            elif not (isinstance(wanted, (int, float)) and math.isfinite(wanted)):
                stop, why = Outcome.REFUSED, f"the tuner asked for {setting} = {wanted!r}, not a finite number"
                new = wanted
            else:
                new = guarded(float(wanted), old, bounds)
                if old is not None and math.isclose(new, old, rel_tol=1e-9, abs_tol=1e-12):
                    continue
                if now < sc.guard.held_until.get(setting, -math.inf):
                    stop, why = stop or Outcome.HELD, why or "rolled back recently"
                elif not self._passed(now, sc.guard.last_change.get(setting, -math.inf), tconf.interval_s):
                    stop, why = stop or Outcome.HELD, why or "changed this interval"
            note = "" if new == wanted else f" (tuner wanted {wanted:g})"
            planned.append(Entry(now, sc.conf.name, tconf.name, setting, old, new, reason + note, Outcome.PUSHED))
        return planned, stop, why

    def _apply(self, sc, tconf, now, changes, reason, recent) -> list[Entry]:
        planned, stop, why = self._plan(sc, tconf, now, changes, reason)
        if not planned:
            return []
        push = {e.setting: e.new for e in planned if e.new is not None}    # a plan sets every new value
        if stop is not None:
            return self._audit([replace(e, outcome=stop, detail=why) for e in planned])
        if any(e.setting in sc.conf.recommend for e in planned):   # the whole decision, never a mix
            if all(sc.recommended.get(e.setting) == e.new for e in planned):
                return []     # said already, and nothing has changed since
            sc.recommended.update({e.setting: e.new for e in planned})
            how = ", ".join(f"{e.setting} as {sc.conf.recommend.get(e.setting, 'is')} {plain(push[e.setting])}"
                            for e in planned)
            return self._audit([replace(e, outcome=Outcome.RECOMMENDED, detail=f"restart-only: set {how} and "
                                        "restart the service") for e in planned])
        if self.dry_run or sc.actuator is None:
            return self._audit([replace(e, outcome=Outcome.DRY_RUN) for e in planned])
        if not self._in_force_as_decided(sc, now):
            return []
        decision = self.audit.new_decision()
        planned = [replace(e, decision=decision) for e in planned]
        if not self._audit(planned):
            return []    # not audited, not pushed
        was = (list(sc.guard.pending), dict(sc.guard.last_change))
        for e in planned:      # owed a judgement from before the push: a kill mid-push still has it judged
            sc.guard.changed(e, now, tconf.interval_s, recent.p99, recent.offered_rps)
        try:
            self._pushing(sc, push)
        except ActuatorError as exc:
            sc.guard.pending[:], sc.guard.last_change = was   # the actuator put the previous values back
            if exc.unreachable:
                self._back_off(sc, now, exc)
            return self._audit([replace(e, outcome=Outcome.PUSH_FAILED, detail=str(exc)) for e in planned])
        sc.settings.update(push)
        return planned

    def _pushing(self, sc: ServiceControl, changes: dict[str, float]) -> None:
        assert sc.actuator is not None, "only a service with an actuator has changes to push"
        self.before_push()
        try:
            sc.actuator.push(changes)
        finally:
            self.after_push()

    def _in_force_as_decided(self, sc: ServiceControl, now: float) -> bool:
        """Read the settings in force again before a push (unless read this tick): False when
        they cannot be read, or changed since the tuner decided (it decides again on them)."""
        if now == sc.read_at:
            return True
        decided_on = dict(sc.settings)
        if not self._refresh(sc, now, fresh=True):
            return False
        changed = {k: v for k, v in sc.settings.items() if decided_on.get(k) != v}
        if changed:
            log.info("service %s: %s changed since the tuner decided; nothing pushed, it decides again on "
                     "the values in force", sc.conf.name, ", ".join(f"{k} = {plain(v)}" for k, v in changed.items()))
        return not changed

    def _judge(self, sc: ServiceControl, interval: Interval) -> list[Entry]:
        """Roll back a change whose next interval has a clearly worse P99 under a similar load;
        a rollback that does not land is retried (with the back-off) until it does. A change
        after which nothing was answered yet waits for an interval that has requests."""
        now, entries = interval.end, []
        for p in [p for p in sc.guard.pending if p.rollback or self._passed(now, p.t, p.interval_s)]:
            if not p.rollback:
                after = interval.starting(sc.conf.name, p.t)
                p99, load = after.p99, after.offered_rps
                if not math.isfinite(p99) and now - p.t < p.interval_s * JUDGE_WAIT_INTERVALS:
                    continue
                similar = load <= p.before_load * LOAD_CHANGED
                worse = math.isfinite(p99) and p99 > max(p.before_p99 * ROLLBACK_WORSE, sc.conf.spec.slo_p99_s)
                p.why = (f"P99 {p99 * 1e3:.0f} ms after the change vs {p.before_p99 * 1e3:.0f} ms before, "
                         f"load {load:.1f}/s vs {p.before_load:.1f}/s")
                if not (worse and similar):
                    sc.guard.pending.remove(p)
                    why_kept = ("load changed too much to judge" if worse else
                                "" if math.isfinite(p99) else "no request answered since the change to judge by")
                    entries += self._audit([Entry(now, sc.conf.name, p.tuner, p.setting, p.old, p.new, p.why,
                                                  Outcome.KEPT, why_kept)])
                    continue
                p.rollback = True
                sc.guard.rolled_back(p, now, HOLD_INTERVALS, MAX_HOLD_S)
            entries += self._roll_back(sc, p, now)
        return entries

    def _roll_back(self, sc: ServiceControl, p, now: float) -> list[Entry]:
        entry = Entry(now, sc.conf.name, p.tuner, p.setting, p.new, p.old, p.why, Outcome.ROLLED_BACK,
                      decision=self.audit.new_decision())
        if not self._audit([entry]):
            return []    # retried next tick
        try:     # under dry-run too: it puts back slotune's own change, it makes none
            self._pushing(sc, {p.setting: p.old})
        except ActuatorError as exc:
            if exc.unreachable:
                self._back_off(sc, now, exc)
            return self._audit([replace(entry, outcome=Outcome.ROLLBACK_FAILED,
                                        detail=f"{exc}; retried until it lands")])
        sc.settings[p.setting] = p.old
        sc.guard.pending.remove(p)
        return [entry]

    def _audit(self, entries: list[Entry]) -> list[Entry]:
        """Write entries to the audit log as one; [] when it cannot be written (counted)."""
        try:
            self.audit.write_all(entries)
        except AuditError as exc:
            self.audit_failures += 1
            log.error("%s; nothing of this decision was pushed", exc)
            return []
        return entries

    def restore(self, now: float) -> list[Entry]:
        """Put back, service by service, the values in force before slotune first changed them."""
        entries = []
        for sc in self.services.values():
            if sc.actuator is None or self.dry_run or not sc.guard.originals:
                continue
            if not self._refresh(sc, now, fresh=True):      # put back only what differs from what is in force
                continue
            back = {k: v for k, v in sc.guard.originals.items() if sc.settings.get(k) != v}
            if not back:
                continue
            planned = [Entry(now, sc.conf.name, "restore", k, sc.settings.get(k), v, "slotune stopped with "
                             "--restore-on-exit", Outcome.RESTORED, decision=self.audit.new_decision())
                       for k, v in back.items()]
            if not self._audit(planned):
                continue
            try:
                self._pushing(sc, back)
                sc.settings.update(back)
                entries += planned
            except ActuatorError as exc:
                entries += self._audit([replace(e, outcome=Outcome.PUSH_FAILED, detail=str(exc)) for e in planned])
        return entries
