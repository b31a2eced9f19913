"""A service is a bulkhead: each stage of a tick that works on one service runs
through Bulkheads.run, so that any exception, or an overrun of the stage's time
budget, is that service's stage failed for this tick: said once per cause (with
the traceback), counted and exported as slotune_service_stage_up and
slotune_service_stage_failures_total, backed off (1 s doubling to 60 s), and
never another service's tick or the process."""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, TypeVar, overload

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from slotune.host.untrusted import inert

log = logging.getLogger(__name__)
T = TypeVar("T")
# What a stage of one service may take before it counts as failed (it is not cut short: Python
# cannot stop a running call, so the budget says and backs off a service that takes the tick).
BUDGET_S = {"window": 1.0, "attribute": 5.0, "read": 5.0, "decide": 20.0, "record": 2.0}
FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 60.0


@dataclass
class _Health:
    up: bool = True
    failures: int = 0
    retry_at: float = -float("inf")
    backoff_s: float = FIRST_BACKOFF_S
    said: set[str] = field(default_factory=set)     # causes already in the log
    took_s: float = 0.0                              # the last run's length
    longest_s: float = 0.0


class Bulkheads:
    """A prometheus_client collector too: the state of each (service, stage) run so far."""

    def __init__(self, budgets: dict[str, float] | None = None, clock: Callable[[], float] = time.monotonic):
        self.budgets, self.clock = dict(BUDGET_S if budgets is None else budgets), clock
        self._health: dict[tuple[str, str], _Health] = {}
        self._lock = threading.Lock()

    @overload
    def run(self, service: str, stage: str, fn: Callable[[], T], default: T) -> T: ...
    @overload
    def run(self, service: str, stage: str, fn: Callable[[], T], default: None = None) -> T | None: ...

    def run(self, service: str, stage: str, fn: Callable[[], T], default: T | None = None) -> T | None:
        """fn() for service's stage; default when it raises, or while the stage is backed off."""
        with self._lock:
            h = self._health.setdefault((service, stage), _Health())
        started = self.clock()
        if started < h.retry_at:
            return default
        try:
            out = fn()
        except Exception as exc:   # whatever a service's input made happen: its stage, not the process
            self._failed(h, service, stage, type(exc).__name__, f"{type(exc).__name__}: {_short(exc)}", exc)
            return default
        took, budget = self.clock() - started, self.budgets.get(stage, float("inf"))
        h.took_s, h.longest_s = took, max(h.longest_s, took)
        if took > budget:
            self._failed(h, service, stage, "overrun", f"took {took:.1f} s, over its {budget:g} s budget", None)
        elif not h.up:
            log.info("service %s: %s works again after %d failure(s)", service, stage, h.failures)
            h.up, h.backoff_s, h.retry_at = True, FIRST_BACKOFF_S, -float("inf")
        return out

    def up(self, service: str, stage: str) -> bool:
        h = self._health.get((service, stage))
        return h is None or h.up

    def forget(self, services: set[str]) -> None:
        """Drop the state of services no longer configured."""
        with self._lock:
            self._health = {k: h for k, h in self._health.items() if k[0] in services}

    def _failed(self, h: _Health, service: str, stage: str, cause: str, what: str, exc: Exception | None) -> None:
        with self._lock:
            h.up, h.failures = False, h.failures + 1
            h.retry_at = self.clock() + h.backoff_s
            backoff, h.backoff_s = h.backoff_s, min(h.backoff_s * 2, MAX_BACKOFF_S)
            first = cause not in h.said
            h.said.add(cause)
        if first:
            log.error("service %s: %s failed (%s); only this service's %s is skipped, retried in %g s "
                      "doubling to %g s; said once per cause", service, stage, what, stage, backoff,
                      MAX_BACKOFF_S, exc_info=exc)
        else:
            log.debug("service %s: %s failed again (%s)", service, stage, what)

    def collect(self):
        with self._lock:
            items = sorted((k, h.up, h.failures, h.took_s, h.longest_s) for k, h in self._health.items())
        up = GaugeMetricFamily("slotune_service_stage_up", "1 while the stage of the service's tick works, 0 "
                               "after it failed (an exception or an overrun of its time budget)",
                               labels=["service", "stage"])
        failures = CounterMetricFamily("slotune_service_stage_failures", "Ticks in which the stage of the "
                                       "service failed", labels=["service", "stage"])
        took = GaugeMetricFamily("slotune_service_stage_seconds", "How long the stage of the service took, the "
                                 "last time and the longest so far", labels=["service", "stage", "which"])
        for (service, stage), is_up, n, last, longest in items:
            up.add_metric([service, stage], 1.0 if is_up else 0.0)
            failures.add_metric([service, stage], n)
            took.add_metric([service, stage, "last"], last)
            took.add_metric([service, stage, "longest"], longest)
        yield up
        yield failures
        yield took


def _short(exc: BaseException) -> str:
    """An exception's message fit for one log line (a service may have put anything in it)."""
    text = inert(" ".join(str(exc).split()))
    return text[:200] + ("..." if len(text) > 200 else "")
