"""Decisions as Grafana annotations: each decision operators are shown (daemon/export/sinks.py)
becomes one POST /api/annotations through grafana-client, at the decision's time, tagged
slotune, host, service, tuner, setting and outcome, its text the audit line (old -> new and
why); on one dashboard when [export] grafana_dashboard_uid is set, else an organization
annotation every dashboard with the Grafana annotations data source can show by tag."""
from __future__ import annotations

import logging
import socket
from urllib.parse import urlparse

from slotune.host.safe_files import read_token
from slotune.model.errors import ActuatorError
from slotune.store.audit import Entry
from slotune.export.sinks import ExportCounters, Outbox

log = logging.getLogger(__name__)
TIMEOUT_S = 5.0


def annotation(entry: Entry, host: str, dashboard_uid: str = "") -> dict:
    """The keyword arguments of grafana-client's add_annotation for one audit entry."""
    tags = ["slotune", f"host:{host}", f"service:{entry.service}", f"tuner:{entry.tuner}",
            f"setting:{entry.setting}", f"outcome:{entry.outcome.label}"]
    return {"time_from": round(entry.t * 1000), "tags": tags, "text": f"slotune {entry.tuner}: {entry.line()}",
            "dashboard_uid": dashboard_uid or None}


def base_url(url: str) -> str:
    """With a trailing slash after a sub-path (grafana-client appends 'api' to it)."""
    path = urlparse(url).path
    return url if not path or path.endswith("/") else url + "/"


class GrafanaAnnotations:
    sink = "grafana"

    def __init__(self, url: str, token_file: str, dashboard_uid: str, counters: ExportCounters):
        self.url, self.token_file, self.dashboard_uid = base_url(url), token_file, dashboard_uid
        self.host = socket.gethostname()
        try:
            read_token(token_file)
        except ActuatorError as exc:    # it may appear later: read again for every annotation
            log.warning("export.grafana_token_file: %s; annotations fail until it is readable", exc)
        self.outbox = Outbox(self.sink, self.url, self._send, counters, batch=1)
        log.info("decisions go to Grafana at %s as annotations%s", self.url,
                 f" on dashboard {dashboard_uid}" if dashboard_uid else " (organization-wide, tag slotune)")

    def decided(self, entries: list[Entry]) -> None:
        self.outbox.offer(entries)

    def tick(self, now: float) -> None:
        pass

    def _send(self, batch: list[Entry]) -> None:
        from grafana_client import GrafanaApi
        from grafana_client.client import GrafanaClientError
        api = GrafanaApi.from_url(self.url, credential=read_token(self.token_file), timeout=TIMEOUT_S)
        for entry in batch:
            try:
                api.annotations.add_annotation(**annotation(entry, self.host, self.dashboard_uid))
            except GrafanaClientError as exc:
                fix = (f"; put a service-account token with the Editor role in {self.token_file}"
                       if exc.status_code in (401, 403) else "")
                raise ConnectionError(f"Grafana answered {exc.status_code} {exc.message}{fix}") from None

    def close(self) -> None:
        self.outbox.close()
