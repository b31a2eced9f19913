"""The Grafana dashboards and provisioning files: the committed files are what the
generator makes, every dashboard is valid current-schema JSON with unique panel ids
and the data source only as ${datasource}, queries name metrics the code exports,
provisioning follows Grafana's documented format, and `slotune dashboards push`
sends what Grafana's HTTP API expects (checked against a stand-in server)."""
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from slotune.export import dashboards
from tests.conftest import ROOT, run_slotune

DIR = ROOT / "dashboards"
DS = {"type": "prometheus", "uid": "${datasource}"}
MODELS = dashboards.all_dashboards()


def walk(node, path=""):
    """Every (path, dict) in a JSON tree."""
    if isinstance(node, dict):
        yield path, node
        for k, v in node.items():
            yield from walk(v, f"{path}/{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from walk(v, f"{path}/{i}")


def all_panels(model):
    for panel in model["panels"]:
        yield panel
        yield from panel.get("panels", [])


def exprs(model):
    return [t["expr"] for p in all_panels(model) for t in p.get("targets", [])]


def test_committed_files_are_what_the_generator_makes(tmp_path):
    out = run_slotune("dashboards", "install", str(tmp_path), "--dashboards-path", dashboards.DEFAULT_DASHBOARDS_PATH)
    assert out.returncode == 0, out.stderr
    made = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    assert len(made) == len(MODELS) + 2
    for rel in made:
        assert (DIR / rel).read_text() == (tmp_path / rel).read_text(), \
            f"dashboards/{rel} is stale: run `slotune dashboards install dashboards --dashboards-path " \
            f"{dashboards.DEFAULT_DASHBOARDS_PATH}`"


def test_install_points_the_provider_at_the_folder_it_wrote(tmp_path):
    out = run_slotune("dashboards", "install", str(tmp_path / "grafana"), "--prometheus-url", "http://prom:9090")
    assert out.returncode == 0, out.stderr
    provider = yaml.safe_load((tmp_path / "grafana/provisioning/dashboards/slotune.yml").read_text())
    assert provider["providers"][0]["options"]["path"] == str((tmp_path / "grafana").resolve())
    source = yaml.safe_load((tmp_path / "grafana/provisioning/datasources/slotune.yml").read_text())
    assert source["datasources"][0]["url"] == "http://prom:9090"
    assert {p.name for p in (tmp_path / "grafana").glob("*.json")} == {f"{uid}.json" for uid in MODELS}


def test_install_into_an_unwritable_place_says_so(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    out = run_slotune("dashboards", "install", str(blocker / "sub"))
    assert out.returncode == 1 and "cannot write" in out.stderr


@pytest.mark.parametrize("uid", MODELS)
def test_dashboard_is_valid_current_grafana_json(uid):
    model = json.loads((DIR / f"{uid}.json").read_text())
    assert model["uid"] == uid and model["title"].startswith("slotune / ")
    assert model["schemaVersion"] >= 39
    ids = [p["id"] for p in all_panels(model)]
    assert len(ids) == len(set(ids)), f"duplicate panel ids in {uid}"
    for panel in all_panels(model):
        assert panel["type"] in ("row", "timeseries", "stat", "heatmap", "state-timeline", "table")
        g = panel["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0


@pytest.mark.parametrize("uid", MODELS)
def test_panels_do_not_overlap(uid):
    cells = {}
    for panel in all_panels(MODELS[uid]):
        g = panel["gridPos"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{panel['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = panel["title"]


@pytest.mark.parametrize("uid", MODELS)
def test_the_data_source_is_only_ever_the_variable(uid):
    model = MODELS[uid]
    sources = [v for v in model["templating"]["list"] if v["type"] == "datasource"]
    assert [(v["name"], v["query"]) for v in sources] == [("datasource", "prometheus")]
    assert all(v["type"] in ("datasource", "query") for v in model["templating"]["list"])
    for path, node in walk(model):
        if "datasource" in node and not (path.startswith("/templating") and node.get("type") == "datasource"):
            assert node["datasource"] == DS, f"{uid}{path}: hard-coded data source {node['datasource']}"
    for panel in all_panels(model):
        if panel["type"] != "row":
            assert panel["datasource"] == DS and panel["targets"]
            assert all(t["datasource"] == DS for t in panel["targets"])


def metric_names(expr: str) -> set[str]:
    """Metric names an expression selects (words followed by { or [ that are not functions)."""
    return {m for m in re.findall(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*[{\[]", expr) if m not in ("by", "on", "ignoring")}


def source_text() -> str:
    return "\n".join(p.read_text() for folder in ("daemon", "reference_stack")
                     for p in (ROOT / folder).rglob("*.py") if p.name != "dashboards.py")


def test_queries_name_metrics_that_the_code_exports():
    text = source_text()
    rules = yaml.safe_load((DIR / "rules" / "slotune.rules.yml").read_text())
    recorded = {r["record"] for g in rules["groups"] for r in g["rules"] if "record" in r}
    queries = [q for m in MODELS.values() for q in exprs(m)]
    queries += [a["expr"] for m in MODELS.values() for a in m["annotations"]["list"]]
    queries += [v["definition"] for m in MODELS.values() for v in m["templating"]["list"] if v["type"] == "query"]
    for expr in queries:
        for name in metric_names(expr):
            if ":" in name:
                assert name in recorded, f"{name} is not recorded by dashboards/rules/slotune.rules.yml"
                continue
            base = re.sub(r"_(bucket|sum|count|total)$", "", name)
            assert f'"{base}' in text or f"'{base}" in text, f"{name} (in {expr!r}) is exported by no code"


def test_variables_chain_and_panels_use_them():
    for uid, model in MODELS.items():
        names = [v["name"] for v in model["templating"]["list"]]
        assert names[:2] == ["datasource", "instance"], uid
        used = " ".join(exprs(model)) + " ".join(p["title"] for p in all_panels(model))
        for name in names[1:]:
            assert f"${name}" in used, f"{uid}: variable {name} is never used"


def test_fleet_lists_services_worst_first():
    table = next(p for p in all_panels(MODELS["slotune-fleet"]) if p["title"] == "Services, worst first")
    sort = next(t for t in table["transformations"] if t["id"] == "sortBy")["options"]["sort"]
    assert sort == [{"field": "P99 / SLO", "desc": True}]


def test_tuner_decisions_are_annotations():
    notes = {a["name"]: a for a in MODELS["slotune-tuners"]["annotations"]["list"]}
    assert set(notes) == {"Pushes", "Rollbacks", "Failed pushes"}
    assert 'outcome=~"rolled_back|rollback_failed"' in notes["Rollbacks"]["expr"]
    assert all(a["datasource"] == DS and a["enable"] for a in notes.values())


# Grafana's documented provisioning format (grafana.com/docs/grafana/latest/administration/provisioning/).
DATASOURCE_KEYS = {"name", "type", "uid", "access", "orgId", "url", "user", "database", "basicAuth",
                   "basicAuthUser", "withCredentials", "isDefault", "jsonData", "secureJsonData", "version",
                   "editable"}
PROVIDER_KEYS = {"name", "orgId", "folder", "folderUid", "type", "disableDeletion", "updateIntervalSeconds",
                 "allowUiUpdates", "options"}


def test_datasource_provisioning_follows_grafanas_format():
    doc = yaml.safe_load((DIR / "provisioning" / "datasources" / "slotune.yml").read_text())
    assert doc["apiVersion"] == 1 and set(doc) <= {"apiVersion", "datasources", "deleteDatasources", "prune"}
    for source in doc["datasources"]:
        assert set(source) <= DATASOURCE_KEYS, set(source) - DATASOURCE_KEYS
        assert {"name", "type", "access", "url"} <= set(source)
        assert source["type"] == "prometheus" and source["access"] in ("proxy", "direct")
        assert source["url"].startswith("http")
        assert source["jsonData"]["httpMethod"] in ("GET", "POST")


def test_dashboard_provisioning_follows_grafanas_format():
    doc = yaml.safe_load((DIR / "provisioning" / "dashboards" / "slotune.yml").read_text())
    assert doc["apiVersion"] == 1 and set(doc) == {"apiVersion", "providers"}
    for provider in doc["providers"]:
        assert set(provider) <= PROVIDER_KEYS, set(provider) - PROVIDER_KEYS
        assert provider["type"] == "file" and provider["name"]
        assert Path(provider["options"]["path"]).is_absolute()
        assert provider["folderUid"] == dashboards.FOLDER_UID
        assert set(provider["options"]) <= {"path", "foldersFromFilesStructure"}


# ---- `slotune dashboards push` against a stand-in for Grafana's HTTP API --------------------------
# STAND-IN: no Grafana server can be installed on these machines, so this small HTTP server plays the
# three endpoints the push uses (GET /api/folders/<uid>, POST /api/folders, POST /api/dashboards/db),
# records every request and answers as Grafana documents. The CLI under test is the real one.

class GrafanaStandIn(BaseHTTPRequestHandler):
    token = "glsa_test_token"
    sub_path = ""            # Grafana served under a sub-path (root_url .../grafana/)
    folders: dict
    requests: list

    def log_message(self, *args):
        pass

    def _answer(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _record(self) -> dict | None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        raw, self.path = self.path, self.path.removeprefix(self.sub_path)
        self.requests.append({"method": self.command, "path": self.path, "raw_path": raw, "body": body,
                              "auth": self.headers.get("Authorization")})
        return body

    def _authorized(self) -> bool:
        if self.headers.get("Authorization") != f"Bearer {self.token}":
            self._answer(401, {"message": "invalid API key"})
            return False
        return True

    def do_GET(self):
        self._record()
        if not self._authorized():
            return
        uid = self.path.removeprefix("/api/folders/")
        if self.path.startswith("/api/folders/") and uid in self.folders:
            self._answer(200, {"uid": uid, "title": self.folders[uid]})
        else:
            self._answer(404, {"message": "folder not found"})

    def do_POST(self):
        body = self._record()
        if not self._authorized():
            return
        if self.path == "/api/folders":
            self.folders[body["uid"]] = body["title"]
            self._answer(200, {"uid": body["uid"], "title": body["title"]})
        elif self.path == "/api/dashboards/db":
            if body.get("folderUid") not in self.folders:
                self._answer(400, {"message": "folder not found"})
                return
            uid = body["dashboard"]["uid"]
            self._answer(200, {"status": "success", "uid": uid, "url": f"{self.sub_path}/d/{uid}/x", "version": 1})
        else:
            self._answer(404, {"message": "not found"})


@pytest.fixture
def grafana():
    handler = type("Handler", (GrafanaStandIn,), {"folders": {}, "requests": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield handler, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_push_creates_the_folder_and_overwrites_every_dashboard(grafana):
    handler, url = grafana
    out = run_slotune("dashboards", "push", "--url", url, "--token", handler.token, timeout=60)
    assert out.returncode == 0, out.stderr
    assert all(r["auth"] == f"Bearer {handler.token}" for r in handler.requests)
    assert [(r["method"], r["path"]) for r in handler.requests[:2]] == [
        ("GET", "/api/folders/slotune"), ("POST", "/api/folders")]
    assert handler.requests[1]["body"] == {"title": "slotune", "uid": "slotune"}
    posted = [r["body"] for r in handler.requests if r["path"] == "/api/dashboards/db"]
    assert [p["dashboard"]["uid"] for p in posted] == list(MODELS)
    for payload in posted:
        assert payload["overwrite"] is True and payload["folderUid"] == "slotune"
        assert payload["dashboard"]["id"] is None
        assert payload["dashboard"]["panels"] == MODELS[payload["dashboard"]["uid"]]["panels"]
    assert f"{url}/d/slotune-fleet/x" in out.stdout


def test_push_into_an_existing_folder_does_not_create_it(grafana, tmp_path):
    handler, url = grafana
    handler.folders["slotune"] = "GPU hosts"
    token_file = tmp_path / "token"
    token_file.write_text(handler.token + "\n")
    out = run_slotune("dashboards", "push", "--url", url + "/", "--token-file", str(token_file), timeout=60)
    assert out.returncode == 0, out.stderr
    assert not [r for r in handler.requests if r["path"] == "/api/folders"]
    assert len([r for r in handler.requests if r["path"] == "/api/dashboards/db"]) == len(MODELS)


def test_push_to_grafana_under_a_sub_path(grafana):
    handler, url = grafana
    handler.sub_path = "/grafana"
    out = run_slotune("dashboards", "push", "--url", url + "/grafana", "--token", handler.token, timeout=60)
    assert out.returncode == 0, out.stderr
    assert all(r["raw_path"].startswith("/grafana/api/") for r in handler.requests)
    assert len([r for r in handler.requests if r["path"] == "/api/dashboards/db"]) == len(MODELS)
    assert f"{url}/grafana/d/slotune-kernel/x" in out.stdout


def test_push_with_a_wrong_token_says_so(grafana):
    handler, url = grafana
    out = run_slotune("dashboards", "push", "--url", url, "--token", "wrong", timeout=60)
    assert out.returncode == 1
    assert "refused the token (401)" in out.stderr and "Editor" in out.stderr


def test_push_without_a_token_or_with_a_bad_url_names_the_fix():
    out = run_slotune("dashboards", "push", "--url", "http://127.0.0.1:1", env={"PATH": "/usr/bin"}, timeout=60)
    assert out.returncode == 1 and "--token" in out.stderr and "Service accounts" in out.stderr
    out = run_slotune("dashboards", "push", "--url", "grafana:3000", "--token", "t", timeout=60)
    assert out.returncode == 1 and "is not a Grafana URL" in out.stderr


def test_push_to_nothing_listening_fails_cleanly():
    out = run_slotune("dashboards", "push", "--url", "http://127.0.0.1:1", "--token", "t", timeout=60)
    assert out.returncode == 1 and "cannot talk to Grafana at http://127.0.0.1:1" in out.stderr
    assert "Traceback" not in out.stderr
