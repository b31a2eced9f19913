"""The daemon process: every collection interval it reads all collectors,
builds one Window per service and one Interval of them, hands that to
attribution, the control loop and the baseline recorder, and publishes what it
found for /metrics and /status; it reloads its config on SIGHUP and detaches
every probe on SIGTERM. Each service's window, attribution, decisions and
baseline rows run in its bulkhead (daemon/host/bulkheads.py). Ticks keep time by
the monotonic clock, so a step of the wall clock neither stalls nor rushes them."""
from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from functools import partial

from prometheus_client import CollectorRegistry

from slotune import config as config_mod
from slotune.attribution import explain as attribution, timeable
from slotune.collectors.gpu.collector import NvmlCollector
from slotune.collectors.kernel.collector import RESCAN_S, KernelCollector
from slotune.collectors.kernel.families import FAMILIES
from slotune.collectors.kernel.targeting import Targeting
from slotune.collectors.service_metrics import ServiceMetricsCollector
from slotune.actuators import for_control
from slotune.store.audit import AuditLog
from slotune.control.guard_state import GuardFile
from slotune.control.loop import ControlLoop
from slotune.export.loop_metrics import LoopMetrics, LoopView
from slotune.export.samples import SampleExporter
from slotune.export.server import MetricsServer
from slotune.export import sinks
from slotune.host import sdnotify
from slotune.host.bulkheads import Bulkheads
from slotune.host.signals import Signals
from slotune.model import window
from slotune.model.histogram import export_bounds, merged
from slotune.model.columns import History
from slotune.model.interval import Interval
from slotune.store.baselines import BaselineStore
from slotune.store.recorder import BaselineRecorder
from slotune.model import signals

log = logging.getLogger(__name__)
STORE_BUSY_S = 0.5         # a locked baseline store costs a tick at most this long
HISTORY_S = 600.0          # windows kept per service (attribution horizon and tuners' look-back)
MAX_FAILED_INTERVALS = 30  # this many failing intervals in a row (the daemon's own fault) end the process
# The watchdog's allowance while a push runs: the slowest surface's worst case (Triton: 4 calls
# of 30 s; nginx: 4 steps of 10 s), so systemd never kills the daemon mid-push.
PUSH_WATCHDOG_S = 150.0
CLOCK_STEP_S = 1.0         # the wall clock moving this much against the monotonic one is a step, said
# Keys read only when the daemon starts; a reload that changes one is refused.
RESTART_ONLY = ("exporter_address", "audit_log", "baseline_store", "state_file", "collect_interval_s", "probes",
                "bpf_map_entries", "export")


def untimeable(cfg: config_mod.Config) -> dict[str, str]:
    """The services whose requests can never be timed, and why (attribution/timeable.py)."""
    return timeable.untimeable(cfg.services, {p for f in cfg.probes for p in FAMILIES[f].times})


class Daemon:
    def __init__(self, cfg: config_mod.Config, dry_run: bool = False, collectors=None, restore_on_exit=False):
        self.cfg, self.forced_dry_run = cfg, dry_run
        self.metrics = LoopMetrics()
        self.exporter = SampleExporter(export_bounds(self.cfg.export.buckets_per_octave))
        self.registry = CollectorRegistry()
        self.registry.register(self.metrics)
        self.registry.register(self.exporter)
        self.bulkheads = Bulkheads()
        self.registry.register(self.bulkheads)
        self.clock = SteadyClock()
        self.collectors = list(collectors) if collectors is not None else self._default_collectors(cfg)
        for c in self.collectors:
            for extra in c.metric_families():
                self.registry.register(extra)
        self.history: dict[str, History] = defaultdict(lambda: History(maxlen=self._history_len()))
        self.audit = AuditLog(cfg.audit_log)
        self.store = BaselineStore(cfg.baseline_store, busy_timeout_s=STORE_BUSY_S)
        self.recorder = BaselineRecorder(self.store, cfg.environment, cfg.deploy_id, cfg.baseline_retention_days,
                                         lambda: self.cfg)
        self.registry.register(self.recorder)
        self.guard_file = GuardFile(cfg.state_file)
        self.sinks = sinks.start(cfg, self.registry, self.exporter)   # decisions to Grafana / OTLP, if [export] says so
        self.watchdog_s = sdnotify.watchdog_interval()
        self.control = ControlLoop(cfg, self._actuators(cfg), self.audit, dry_run or cfg.dry_run,
                                   self.recorder.baseline, self.guard_file.load(), self.bulkheads,
                                   self._before_push, self._after_push)
        self.restore_on_exit = restore_on_exit
        self.state_errors = 0
        self.signals = Signals()
        self.server: MetricsServer | None = None
        self.explained: dict[str, attribution.Explanation] = {}     # the last explanations, by service
        self.explained_span: int | None = None      # the RECENT_S span they judged (end // RECENT_S)
        self.untimeable = untimeable(cfg)          # service -> why its requests can never be timed
        self.shown = self._status(Interval(0.0, 0.0, {}), LoopView())   # until the first tick

    @property
    def dry_run(self) -> bool:
        """Kept by the control loop, the one that acts on it."""
        return self.control.dry_run

    def _history_len(self) -> int:
        return max(int(HISTORY_S / self.cfg.collect_interval_s), 10)

    @staticmethod
    def _default_collectors(cfg):
        """The service's own metrics, the kernel probes, and the GPUs the services' processes use."""
        kernel = KernelCollector(list(cfg.probes), cfg.bpf_map_entries, rescan_s=RESCAN_S)

        def pids_of(service: str) -> set[int]:
            procs = kernel.targets.get(service)
            return set(procs.tgids) if procs else set()
        return [ServiceMetricsCollector(), kernel, NvmlCollector(pids_of=pids_of)]

    @staticmethod
    def _actuators(cfg):
        def owns(spec):
            """owns(pid): pid is one of the service's processes, matched as the kernel probes match them."""
            def check(pid: int) -> bool:
                targeting = Targeting([spec])
                return targeting.matches(pid, spec, targeting.port_listeners())
            return check
        return {s.name: for_control(s.control, owns(s.spec)) for s in cfg.services if s.control is not None}

    # --- life cycle ---------------------------------------------------------
    def start(self) -> None:
        specs = [s.spec for s in self.cfg.services]
        for c in self.collectors:
            c.start(specs)
        self._report_health()
        self.server = MetricsServer(self.cfg.exporter_address, self.cfg.exporter_host_port, self.registry,
                                    lambda: self.shown)
        self._say_untimeable(set())
        mode = "dry-run (decides, pushes nothing)" if self.dry_run else "closed loop"
        log.info("slotune running: %d service(s), %s, metrics on http://%s/metrics",
                 len(self.cfg.services), mode, self.cfg.exporter_address)
        sdnotify.ready()

    def close(self) -> None:
        sdnotify.stopping()
        if self.restore_on_exit:
            restored = self.control.restore(self.clock.now())
            self._save_guards()
            log.info("restore on exit: %d setting(s) put back", len(restored))
        for c in self.collectors:
            try:
                c.close()
            except Exception:
                log.exception("closing collector %s", c.name)
        self.sinks.close()
        self.control.close()
        if self.server:
            self.server.close()
            self.server = None
        self.audit.close()
        self.store.close()
        self.signals.close()

    def handle_signals(self) -> None:
        """SIGTERM/SIGINT stop, SIGHUP reloads; installed before start() says READY=1."""
        self.signals.install()

    def _wait_until(self, end: float, alive: bool) -> None:
        """Sleep until `end` on the steady clock (or a stop), pinging the systemd watchdog at
        half its interval while the last tick completed: a daemon whose ticks fail goes quiet."""
        watchdog = self.watchdog_s
        while not self.signals.stop:
            left = end - self.clock.now()
            if watchdog and alive:
                sdnotify.watchdog_ping()
            if left <= 0:
                return
            self.signals.sleep(min(left, watchdog / 2) if watchdog else left)

    def run_forever(self) -> None:
        """The main loop, until SIGTERM/SIGINT; handle_signals() was called before start()."""
        start, failures = self.clock.now(), 0
        try:
            while not self.signals.stop:
                end = start + self.cfg.collect_interval_s
                self._wait_until(end, failures == 0)
                if self.signals.stop:
                    break
                if self.signals.reload:
                    self.signals.reload = False
                    self.reload()
                try:
                    began = self.clock.now()
                    self.step(start, began)
                    self.metrics.ticked(self.clock.now() - began, self.cfg.collect_interval_s)
                    failures = 0
                except Exception:
                    failures += 1
                    log.exception("interval failed (%d in a row); the daemon goes on", failures)
                    if failures >= MAX_FAILED_INTERVALS:
                        raise   # exit non-zero: systemd restarts us (Restart=on-failure)
                now = self.clock.now()
                start = end if now - end < self.cfg.collect_interval_s else now
        finally:
            self.close()

    def _say_untimeable(self, said: set[str]) -> None:
        """Each `downstream` that can never be timed, one line each, once per config."""
        for line in timeable.downstream_lines(self.cfg.services, self.untimeable):
            if line not in said:
                log.warning("%s", line)

    def _before_push(self) -> None:
        """A push may outlast the watchdog: its judgement owed is saved first, and systemd
        is given PUSH_WATCHDOG_S until _after_push()."""
        self._save_guards()
        if self.watchdog_s:
            sdnotify.notify(f"WATCHDOG=1\nWATCHDOG_USEC={int(max(PUSH_WATCHDOG_S, self.watchdog_s) * 1e6)}")

    def _after_push(self) -> None:
        if self.watchdog_s:
            sdnotify.notify(f"WATCHDOG=1\nWATCHDOG_USEC={int(self.watchdog_s * 1e6)}")

    def reload(self) -> bool:
        """Re-read the config file; a file that is bad, or that changes a key read only at
        start, is refused whole and the running config kept. dry_run applies at once."""
        try:
            new = config_mod.load(self.cfg.path)
            fixed = [k for k in RESTART_ONLY if getattr(new, k) != getattr(self.cfg, k)]
            if fixed:
                raise config_mod.ConfigError(new.path, f"daemon.{fixed[0]}", (
                    f"changed from {getattr(self.cfg, fixed[0])!r} to {getattr(new, fixed[0])!r}, which takes "
                    "effect only at start: restart slotune (systemctl restart slotune) to apply it"))
        except Exception as exc:   # whatever went wrong, the running config stays
            log.error("config reload refused, keeping the running config: %s", exc)
            return False
        sdnotify.reloading()
        dry_run = self.forced_dry_run or new.dry_run
        if dry_run != self.dry_run:
            log.warning("config reload: dry-run is now %s", "on: nothing will be pushed" if dry_run
                        else "off: decisions are pushed again")
        self.control.dry_run = dry_run
        self.recorder.environment, self.recorder.deploy_id = new.environment, new.deploy_id
        self.audit.reopen()
        self.recorder.retention_s = new.baseline_retention_days * 86400.0
        said = set(timeable.downstream_lines(self.cfg.services, self.untimeable))
        self.cfg, self.untimeable = new, untimeable(new)
        self._say_untimeable(said)
        self.explained, self.explained_span = {}, None
        specs = [s.spec for s in new.services]
        for c in self.collectors:
            c.update_services(specs)
        if self.control.reconfigure(new, self._actuators(new), self.clock.now()):
            self._save_guards()
        log.info("config reloaded from %s: %d service(s)", new.path, len(new.services))
        sdnotify.ready()
        return True

    # --- one interval -------------------------------------------------------
    def step(self, start: float, end: float) -> None:
        samples = []
        for c in self.collectors:
            try:
                got = c.collect(start, end)
            except Exception:
                log.exception("collector %s failed this interval; the others go on", c.name)
                continue
            samples += got
            if c.exports_samples:
                self.exporter.observe(got)
        self._report_health()
        by_service = defaultdict(list)
        for s in samples:
            by_service[s.service].append(s)
        built = []
        for svc in self.cfg.services:
            w = self.bulkheads.run(svc.name, "window",
                                   partial(window.build, svc.spec, start, end, by_service.get(svc.name, [])))
            if w is not None:
                self.history[svc.name].append(w)
                built.append(w)
        names = [s.name for s in self.cfg.services]
        interval = Interval(start, end, {name: tuple(self.history[name]) for name in names})
        span = math.floor(end / attribution.RECENT_S)
        if span != self.explained_span:   # each span attribution judges, once, as it ends
            self.explained = attribution.explain_all(
                interval.history, attribution.call_graph(self.cfg.services), now=end, untimeable=self.untimeable,
                guard=lambda name, explain: self.bulkheads.run(name, "attribute", explain))
            self.explained_span = span
        entries = self.control.tick(interval)
        if entries:
            self._save_guards()
        self.sinks.decided(entries)
        view = self._view(self.explained)
        self.metrics.observe(built, entries, view)
        self.recorder.record(interval, names, lambda name, rows: self.bulkheads.run(name, "record", rows))
        self.sinks.tick(end)        # after this tick's metrics: a snapshot over OTLP includes it
        self.shown = self._status(interval, view)

    def _save_guards(self) -> None:
        try:
            self.guard_file.save(self.control.guards())
        except OSError as exc:
            if not self.state_errors:
                log.error("cannot save the guards' state to %s (%s): a restart now would forget pending "
                          "judgements and holds; fix: free space or permissions there, or set daemon.state_file",
                          self.guard_file.path, exc)
            self.state_errors += 1

    def _view(self, explained: dict) -> LoopView:
        settings, reachable = {}, {}
        for name, sc in self.control.services.items():
            reachable[name] = sc.control_ok
            settings.update({(name, k): v for k, v in sc.settings.items() if k in sc.conf.settings})
        owed = {(name, p.setting) for name, sc in self.control.services.items() for p in sc.guard.pending
                if p.rollback}
        return LoopView(settings, reachable, dict(explained), dict(self.control.drift), owed,
                        self.control.audit_failures)

    def _report_health(self) -> None:
        for c in self.collectors:
            self.exporter.set_collector_up(c.name, c.up)
            self.exporter.set_probes(c.parts())

    # --- /status -----------------------------------------------------------
    def status(self) -> dict:
        return self.shown

    def _status(self, interval: Interval, view: LoopView) -> dict:
        """The JSON `slotune status` shows, built once per tick (a request reads it whole)."""
        services = {}
        for svc in self.cfg.services:
            w = interval.latest(svc.name)
            exp = view.attribution.get(svc.name)
            services[svc.name] = {
                "slo_p99_s": svc.spec.slo_p99_s,
                "p50_s": _finite(w.p(0.5)) if w else None,
                "p99_s": _finite(w.p(0.99)) if w else None,
                "slo_ttft_p99_s": svc.spec.slo_ttft_p99_s or None,
                "slo_tpot_p99_s": svc.spec.slo_tpot_p99_s or None,
                "ttft_p99_s": _p99(w.ttft) if w else None,
                "tpot_p99_s": _p99(w.tpot) if w else None,
                "rate_rps": w.rate if w else 0.0,
                "rtt_mean_s": _mean(self._rtt_to(svc.name, interval)),
                "runqueue_p99_s": _p99(w.family(signals.RUNQUEUE_WAIT)) if w else None,
                "goodput_rps": w.goodput if w else 0.0,
                "errors": w.errors if w else 0.0,
                "latency_source": w.latency_source if w else "",
                "ttft_source": w.ttft_source if w else "",
                "tpot_source": w.tpot_source if w else "",
                "settings": {k: v for (name, k), v in view.settings.items() if name == svc.name},
                "control_reachable": bool(view.reachable.get(svc.name)),
                "attribution": exp.as_status() if exp else None,
            }
        decisions = [e.__dict__ for e in list(self.audit.recent)[-20:]]
        return {"dry_run": self.dry_run, "services": services, "decisions": decisions,
                "collectors": {c.name: c.up for c in self.collectors}}


    def _rtt_to(self, name: str, interval: Interval):
        """The smoothed TCP RTT of the connections to a service. Where a watched caller names
        it in its [peers], from the caller's sockets: a request's round trip, as the reply
        carries its ACK (a Redis GET). Else from the service's own sockets, whose replies'
        ACKs wait for the client's next request or its delayed-ACK timer (up to 40 ms)."""
        seen = [w.histograms.get((signals.TCP_RTT, name)) for other in self.cfg.services
                if (w := interval.latest(other.name)) is not None]
        callers = [h for h in seen if h is not None]
        if callers:
            return merged(callers)
        own = interval.latest(name)
        return own.family(signals.TCP_RTT) if own is not None else None


def _finite(v: float) -> float | None:
    return v if math.isfinite(v) else None


def _mean(h) -> float | None:
    return h.mean() if h is not None and h.count else None


def _p99(h) -> float | None:
    return _finite(h.quantile(0.99)) if h is not None and h.count else None


class SteadyClock:
    """Wall-clock seconds as they were at start, advanced by the monotonic clock: ticks,
    holds and back-offs keep their length when the wall clock steps (NTP, an operator).
    A step is said once in the log with its size; slotune's stamps stay that far from the
    wall clock until it restarts."""

    def __init__(self):
        self.wall0, self.mono0 = time.time(), time.monotonic()
        self.offset = 0.0      # the wall clock's steps so far, as last said

    def now(self) -> float:
        steady = self.wall0 + time.monotonic() - self.mono0
        offset = time.time() - steady
        if abs(offset - self.offset) >= CLOCK_STEP_S:
            log.warning("the wall clock stepped by %+.1f s; slotune keeps time by the monotonic clock (ticks and "
                        "holds keep their length; its timestamps are %+.1f s off the wall clock until it restarts)",
                        offset - self.offset, -offset)
            self.offset = offset
        return steady
