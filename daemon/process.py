"""The daemon process: every collection interval it reads all collectors,
builds one Window per service, feeds attribution, the control loop, the
exporter and the baseline store; it serves /metrics and /status, reloads its
config on SIGHUP and detaches every probe on SIGTERM."""
from __future__ import annotations

import json
import logging
import math
import signal
import threading
import time
from collections import defaultdict, deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry
from tuners import drift
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from daemon.attribution import explain as attribution
from daemon import config as config_mod
from daemon.host import sdnotify
from daemon.model import window
from daemon.control.actuators import for_control
from daemon.control.audit import AuditLog
from daemon.store.baselines import BaselineStore
from daemon.collectors.gpu.metrics import GpuMetrics
from daemon.collectors.kernel.collector import KernelCollector
from daemon.collectors.gpu.collector import NvmlCollector
from daemon.collectors.service_metrics import ServiceMetricsCollector
from daemon.control.loop import DRIFT_METRIC, ControlLoop
from daemon.export.loop_metrics import DaemonMetrics
from daemon.export.samples import SampleExporter

log = logging.getLogger(__name__)
HISTORY_S = 600.0          # windows kept per service (attribution horizon and tuners' look-back)
BASELINE_EVERY_S = 10.0    # one baseline point per service and metric this often
MAX_FAILED_INTERVALS = 30  # this many failing intervals in a row end the process


class Daemon:
    def __init__(self, cfg: config_mod.Config, dry_run: bool = False, collectors=None):
        self.cfg, self.dry_run = cfg, dry_run or cfg.dry_run
        self.metrics = DaemonMetrics()
        self.exporter = SampleExporter()
        self.registry = CollectorRegistry()
        self.registry.register(self.metrics)
        self.registry.register(self.exporter)
        self.collectors = list(collectors) if collectors is not None else self._default_collectors(cfg)
        for c in self.collectors:
            if isinstance(c, NvmlCollector):
                self.registry.register(GpuMetrics(c))
        self.history: dict[str, deque] = defaultdict(lambda: deque(maxlen=self._history_len()))
        self.audit = AuditLog(cfg.audit_log)
        self.store = BaselineStore(cfg.baseline_store)
        self.control = ControlLoop(cfg, self._actuators(cfg), self.audit, self.dry_run, self._baseline)
        self.metrics.drift = self.control.drift
        self.stop_event = threading.Event()
        self.reload_requested = False
        self.server: ThreadingHTTPServer | None = None
        self.last_baseline_t = 0.0
        self.lock = threading.Lock()   # the HTTP thread reads what the loop writes

    def _history_len(self) -> int:
        return max(int(HISTORY_S / self.cfg.collect_interval_s), 10)

    @staticmethod
    def _default_collectors(cfg):
        """The service's own metrics, the kernel probes, and the GPUs the services' processes use."""
        kernel = KernelCollector(list(cfg.probes))

        def pids_of(service: str) -> set[int]:
            procs = kernel.targets.get(service)
            return set(procs.tgids) if procs else set()
        return [ServiceMetricsCollector(), kernel, NvmlCollector(pids_of=pids_of)]

    @staticmethod
    def _actuators(cfg):
        return {s.name: for_control(s.control) for s in cfg.services if s.control is not None}

    # --- life cycle ---------------------------------------------------------
    def start(self) -> None:
        specs = [s.spec for s in self.cfg.services]
        for c in self.collectors:
            c.start(specs)
        self._report_health()
        self._serve()
        mode = "dry-run (decides, pushes nothing)" if self.dry_run else "closed loop"
        log.info("slotune running: %d service(s), %s, metrics on http://%s/metrics",
                 len(self.cfg.services), mode, self.cfg.exporter_address)
        sdnotify.ready()

    def close(self) -> None:
        sdnotify.stopping()
        for c in self.collectors:
            try:
                c.close()
            except Exception:
                log.exception("closing collector %s", c.name)
        if self.server:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
        self.audit.close()
        self.store.close()

    def run_forever(self) -> None:
        signal.signal(signal.SIGTERM, lambda *_: self.stop_event.set())
        signal.signal(signal.SIGINT, lambda *_: self.stop_event.set())
        signal.signal(signal.SIGHUP, lambda *_: setattr(self, "reload_requested", True))
        watchdog = sdnotify.watchdog_interval()
        start, failures = time.time(), 0
        try:
            while not self.stop_event.is_set():
                end = start + self.cfg.collect_interval_s
                self.stop_event.wait(max(0.0, end - time.time()))
                if self.stop_event.is_set():
                    break
                if self.reload_requested:
                    self.reload_requested = False
                    self.reload()
                try:
                    self.step(start, time.time())
                    failures = 0
                except Exception:
                    failures += 1
                    log.exception("interval failed (%d in a row); the daemon goes on", failures)
                    if failures >= MAX_FAILED_INTERVALS:
                        raise   # exit non-zero: systemd restarts us (Restart=on-failure)
                if watchdog:
                    sdnotify.watchdog_ping()
                start = end if time.time() - end < self.cfg.collect_interval_s else time.time()
        finally:
            self.close()

    def reload(self) -> bool:
        """Re-read the config file; a bad file is refused and the running config kept."""
        try:
            new = config_mod.load(self.cfg.path)
        except config_mod.ConfigError as exc:
            log.error("config reload refused, keeping the running config: %s", exc)
            return False
        sdnotify.reloading()
        with self.lock:
            self.cfg = new
            specs = [s.spec for s in new.services]
            for c in self.collectors:
                c.update_services(specs)
            self.control.reconfigure(new, self._actuators(new))
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
            if not isinstance(c, ServiceMetricsCollector):  # services export their own metrics
                self.exporter.observe(got)
        self._report_health()
        by_service = defaultdict(list)
        for s in samples:
            by_service[s.service].append(s)
        with self.lock:
            for svc in self.cfg.services:
                w = window.build(svc.name, svc.spec.slo_p99_s, start, end, by_service.get(svc.name, []),
                                 svc.latency_metric)
                self.history[svc.name].append(w)
                self.metrics.observe_window(w)
            self.metrics.attribution.update(attribution.explain_all(
                {name: self.history[name] for name in (s.name for s in self.cfg.services)},
                attribution.call_graph(self.cfg.services), now=end))
            entries = self.control.tick(end, {k: list(v) for k, v in self.history.items()})
            self.metrics.observe_decisions(entries)
            for name, sc in self.control.services.items():
                self.metrics.reachable[name] = sc.control_ok
                for setting, value in sc.settings.items():
                    if setting in sc.conf.settings:
                        self.metrics.settings[(name, setting)] = value
        if end - self.last_baseline_t >= BASELINE_EVERY_S:
            self._record_baselines(end)

    def _baseline(self, service: str, since: float, until: float) -> drift.Baseline | None:
        """The stored P99 history of this environment (every deploy) as the drift tuner's baseline."""
        values = self.store.values(service, DRIFT_METRIC, self.cfg.environment, since=since, until=until)
        if len(values) < 3:
            return None
        return drift.Baseline(mean=float(values.mean()), std=float(values.std(ddof=1)), windows=len(values),
                              samples=tuple(float(v) for v in values[-500:]), robust_std=drift.robust_std(values))

    def _report_health(self) -> None:
        for c in self.collectors:
            self.exporter.set_collector_up(c.name, c.up)
            if isinstance(c, KernelCollector):
                self.exporter.set_probes(c.attached)

    def _record_baselines(self, now: float) -> None:
        rows = []
        for svc in self.cfg.services:
            recent = [w for w in self.history[svc.name] if w.end > now - BASELINE_EVERY_S and w.requests]
            if not recent:
                continue
            merged = window.merged_latency(recent)
            seconds = sum(w.seconds for w in recent)
            values = {"latency_p50_seconds": merged.quantile(0.5), DRIFT_METRIC: merged.quantile(0.99),
                      "throughput_rps": merged.count / seconds,
                      "error_ratio": sum(w.errors for w in recent) / max(merged.count, 1)}
            rows += [(svc.name, m, v, now, self.cfg.environment, self.cfg.deploy_id)
                     for m, v in values.items() if math.isfinite(v)]
        if rows:
            self.store.record_many(rows)
        self.last_baseline_t = now

    # --- HTTP: /metrics and /status ----------------------------------------
    def status(self) -> dict:
        with self.lock:
            services = {}
            for svc in self.cfg.services:
                hist = self.history.get(svc.name) or []
                w = hist[-1] if hist else None
                sc = self.control.services.get(svc.name)
                services[svc.name] = {
                    "slo_p99_s": svc.spec.slo_p99_s,
                    "p50_s": _finite(w.p(0.5)) if w else None,
                    "p99_s": _finite(w.p(0.99)) if w else None,
                    "rate_rps": w.rate if w else 0.0,
                    "errors": w.errors if w else 0.0,
                    "latency_source": w.latency_source if w else "",
                    "settings": {k: v for k, v in (sc.settings if sc else {}).items() if k in svc.settings},
                    "control_reachable": bool(sc and sc.control_ok),
                    "attribution": exp.as_status() if (exp := self.metrics.attribution.get(svc.name)) else None,
                }
            decisions = [e.__dict__ for e in list(self.audit.recent)[-20:]]
        return {"dry_run": self.dry_run, "services": services, "decisions": decisions,
                "collectors": {c.name: c.up for c in self.collectors}}

    def _serve(self) -> None:
        daemon = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path.startswith("/metrics"):
                    body, ctype = generate_latest(daemon.registry), CONTENT_TYPE_LATEST
                elif self.path.startswith("/status"):
                    body, ctype = json.dumps(daemon.status()).encode(), "application/json"
                else:
                    self.send_error(404, "try /metrics or /status")
                    return
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        host, port = self.cfg.exporter_host_port
        try:
            self.server = ThreadingHTTPServer((host, port), Handler)
        except OSError as exc:
            raise OSError(f"cannot listen on {self.cfg.exporter_address} ({exc.strerror}); "
                          "set daemon.exporter_address to a free HOST:PORT") from None
        threading.Thread(target=self.server.serve_forever, name="exporter", daemon=True).start()


def _finite(v: float) -> float | None:
    return v if math.isfinite(v) else None
