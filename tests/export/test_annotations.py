"""Decisions as Grafana annotations, against a stand-in for Grafana (no Grafana server can be
installed here) that accepts only the request Grafana's HTTP API documents for creating an
annotation: POST /api/annotations, a bearer token (a service account's), a JSON body whose
only required field is `text`, `time` in epoch milliseconds, `tags` a list of strings and
`dashboardUID` optional (grafana/grafana docs/sources/developers/http_api/annotations.md,
"Create Annotation"; https://grafana.com/docs/grafana/latest/developers/http_api/annotations/#create-annotation).
It answers as that page shows: {"message": "Annotation added", "id": N}."""
import json
import logging
import threading
import time

import pytest

from slotune.store.audit import Entry, Outcome
from slotune.export.annotations import GrafanaAnnotations, base_url
from slotune.export.sinks import ExportCounters, Outbox
from reference_stack.launcher import free_ports
from tests.export.conftest import TOKEN, Listener, metric_value, steps, wait_for

OPTIONAL = {"dashboardUID": str, "dashboardId": int, "panelId": int, "time": int, "timeEnd": int, "tags": list}


def grafana_create_annotation(method, path, headers, body):
    """The stand-in's one endpoint, checked as the documentation specifies it."""
    def answer(status, message, **extra):
        return status, {"Content-Type": "application/json"}, json.dumps({"message": message, **extra}).encode()
    if (method, path) != ("POST", "/api/annotations"):
        return answer(404, "Not found")
    if headers.get("Authorization") != f"Bearer {TOKEN}":
        return answer(401, "Unauthorized")
    if headers.get("Content-Type", "").split(";")[0] != "application/json":
        return answer(400, "bad request data: the body must be JSON")
    doc = json.loads(body)
    if not isinstance(doc.get("text"), str) or not doc["text"]:
        return answer(400, "bad request data: text is required")
    for key, value in doc.items():
        if key == "text":
            continue
        kind = OPTIONAL.get(key)
        if kind is None or value is not None and not (isinstance(value, kind) and not isinstance(value, bool)):
            return answer(400, f"bad request data: {key} = {value!r}")
    if isinstance(doc.get("time"), int) and not 1e12 < doc["time"] < 1e13:
        return answer(400, "bad request data: time is not epoch milliseconds")
    if not all(isinstance(t, str) for t in doc.get("tags") or []):
        return answer(400, "bad request data: tags are strings")
    return answer(200, "Annotation added", id=len(accepted) + 1)


accepted: list = []


@pytest.fixture
def grafana():
    accepted.clear()
    server = Listener(lambda *req: _keep(grafana_create_annotation(*req), req))
    yield server
    server.close()


def _keep(result, req):
    if result[0] == 200:
        accepted.append(json.loads(req[3]))
    return result


def export_to(url: str, dashboard: str = "slotune-service") -> str:
    return f"""
        [export]
        grafana_url = "{url}"
        grafana_token_file = "TOKEN_FILE"
        grafana_dashboard_uid = "{dashboard}"
        """


def test_pushed_and_rolled_back_decisions_become_the_documented_requests(make_daemon, grafana):
    daemon, latency = make_daemon(export_to(grafana.url))
    clock = [time.time()]
    latency.p99_s = 0.5                       # over the 200 ms SLO: the whitepaper throttle cuts 10 %
    pushed = [e for e in steps(daemon, clock, 1) if e.outcome == Outcome.PUSHED]
    assert [(e.old, e.new) for e in pushed] == [(100.0, 90.0)]
    latency.p99_s = 2.0                       # far worse after the change, same load: rolled back
    rolled = wait_for(lambda: [e for e in steps(daemon, clock, 1) if e.outcome == Outcome.ROLLED_BACK],
                      "a rollback")
    shown = pushed + rolled
    wait_for(lambda: len(accepted) == len(shown), "the annotations at the stand-in")
    assert [(m, p) for m, p, *_ in grafana.requests] == [("POST", "/api/annotations")] * len(shown)
    held = [e for e in daemon.audit.recent if e.outcome not in (Outcome.PUSHED, Outcome.ROLLED_BACK)]
    for entry, body in zip(shown, accepted):
        assert body["time"] == round(entry.t * 1000) and body["dashboardUID"] == "slotune-service"
        assert set(body["tags"]) == {"slotune", f"host:{daemon.sinks.sinks[0].host}", "service:api", "tuner:throttle",
                                     "setting:rate_limit_rps", f"outcome:{entry.outcome.label}"}
        assert f"api.rate_limit_rps: {entry.old:g} -> {entry.new:g} ({entry.outcome})" in body["text"]
    assert "100 -> 90" in accepted[0]["text"] and "90 -> 100" in accepted[1]["text"]
    assert len(accepted) == len(shown), f"only pushed and rolled-back decisions, not {held}"
    wait_for(lambda: metric_value(daemon, "slotune_export_sent_total", sink="grafana") == len(shown),
             "both counted as sent")
    print(f"annotations: {[b['text'] for b in accepted]}")


def test_a_refused_decision_goes_to_the_organization_under_a_sub_path(tmp_path):
    """No dashboard UID: an organization annotation, so no dashboardUID in the body; Grafana served
    from /grafana/ gets /grafana/api/annotations."""
    prefixed = Listener(lambda m, p, h, b: grafana_create_annotation(m, p.removeprefix("/grafana"), h, b))
    (tmp_path / "token").write_text(TOKEN)
    try:
        sink = GrafanaAnnotations(prefixed.url + "/grafana", str(tmp_path / "token"), "", ExportCounters())
        sink.decided([Entry(time.time(), "api", "batch", "max_batch_size", 8.0, 8.0,
                            "the service has no such setting", Outcome.REFUSED, "tuner stopped")])
        wait_for(lambda: prefixed.requests, "the request")
        sink.close()
    finally:
        prefixed.close()
    method, path, headers, body = prefixed.requests[0]
    assert (method, path) == ("POST", "/grafana/api/annotations")
    doc = json.loads(body)
    assert "dashboardUID" not in doc and "outcome:refused" in doc["tags"] and "tuner stopped" in doc["text"]
    assert base_url("http://g:3000") == "http://g:3000" and base_url("http://g/x") == "http://g/x/"


def test_grafana_down_slow_or_refusing_never_holds_up_the_loop(make_daemon, caplog):
    """A Grafana that accepts connections and never answers, then one that refuses the token:
    each interval still takes what it takes without Grafana; failures are counted, said once."""
    hang = threading.Event()
    slow = Listener(lambda *req: (hang.wait(30), (200, {}, b"{}"))[1])
    try:
        caplog.set_level(logging.INFO, logger="slotune.export.sinks")
        daemon, latency = make_daemon(export_to(slow.url))
        clock = [time.time()]
        latency.p99_s = 0.5
        began = time.monotonic()
        entries = steps(daemon, clock, 6)       # pushes every second: each one an annotation
        took = time.monotonic() - began
        assert sum(e.outcome == Outcome.PUSHED for e in entries) >= 2
        assert took < 3.0, f"6 intervals took {took:.1f} s with Grafana hanging (a request times out in 5 s)"
    finally:
        hang.set()
        slow.close()
    wait_for(lambda: metric_value(daemon, "slotune_export_failed_total", sink="grafana") >= 1, "a counted failure")
    said = [r for r in caplog.records if "export grafana" in r.getMessage() and "failed" in r.getMessage()]
    assert len(said) == 1 and "the control loop goes on" in said[0].getMessage()


def test_a_wrong_token_is_counted_and_said_once(make_daemon, grafana, caplog, tmp_path):
    caplog.set_level(logging.INFO, logger="slotune.export.sinks")
    daemon, latency = make_daemon(export_to(grafana.url))
    (tmp_path / "grafana.token").write_text("not-the-token\n")
    clock = [time.time()]
    latency.p99_s = 0.5
    pushed = [e for e in steps(daemon, clock, 6) if e.outcome == Outcome.PUSHED]
    wait_for(lambda: metric_value(daemon, "slotune_export_failed_total", sink="grafana") == len(pushed),
             "every annotation refused")
    said = [r.getMessage() for r in caplog.records if "export grafana" in r.getMessage()]
    assert len(pushed) >= 2 and len(said) == 1 and "401" in said[0] and TOKEN not in said[0]
    assert not accepted


def test_a_full_queue_drops_and_counts_without_waiting():
    counters, entered, release = ExportCounters(), threading.Event(), threading.Event()

    def send(batch):
        entered.set()
        release.wait(10)
    box = Outbox("test", "nowhere", send, counters, batch=1, capacity=2)
    box.offer([1])
    assert entered.wait(5)                     # the sink's thread holds item 1
    began = time.monotonic()
    box.offer([2, 3, 4, 5])                    # 2 fit
    assert time.monotonic() - began < 0.5
    assert counters.counts["dropped"]["test"] == 2
    release.set()
    box.close()
    assert counters.counts["sent"]["test"] == 3


def test_a_closed_port_is_a_counted_failure_that_names_grafana(make_daemon, caplog):
    caplog.set_level(logging.INFO, logger="slotune.export.sinks")
    url = f"http://127.0.0.1:{free_ports(1)[0]}"
    daemon, latency = make_daemon(export_to(url))
    clock = [time.time()]
    latency.p99_s = 0.5
    steps(daemon, clock, 2)
    wait_for(lambda: metric_value(daemon, "slotune_export_failed_total", sink="grafana") >= 1, "a counted failure")
    said = [r.getMessage() for r in caplog.records if "export grafana" in r.getMessage()]
    assert len(said) == 1 and url in said[0]
