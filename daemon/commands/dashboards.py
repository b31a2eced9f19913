"""`slotune dashboards install|push`: write the Grafana dashboards and provisioning
files to a folder, or upload the dashboards to a Grafana through its HTTP API."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from urllib.parse import urlparse

from slotune.export import dashboards

NAME = "dashboards"
HELP = "write the Grafana dashboards and provisioning files (install) or upload them to Grafana (push)"
EXAMPLES = """  slotune dashboards install /var/lib/grafana/dashboards/slotune
  slotune dashboards install ./grafana --dashboards-path /var/lib/grafana/dashboards/slotune --prometheus-url http://prom:9090
  slotune dashboards push --url http://127.0.0.1:3000 --token "$GRAFANA_TOKEN"
  slotune dashboards push --url https://grafana.example.com/grafana/ --token-file /etc/slotune/grafana.token --folder "GPU hosts"
"""


def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    install = sub.add_parser("install", help="write <uid>.json per dashboard and provisioning/ for Grafana into DIR")
    install.add_argument("dir", metavar="DIR", type=Path, help="folder to write (created if missing)")
    install.add_argument("--dashboards-path", default=None,
                         help="where Grafana will read the JSON files (the provider's options.path; default: DIR)")
    install.add_argument("--prometheus-url", default="http://127.0.0.1:9090",
                         help="the Prometheus the provisioned data source points at (default: %(default)s)")
    push = sub.add_parser("push", help="upload every dashboard to Grafana (POST /api/dashboards/db, overwrite)")
    push.add_argument("--url", default=os.environ.get("GRAFANA_URL"),
                      help="Grafana's base URL (default: $GRAFANA_URL)")
    push.add_argument("--token", default=os.environ.get("GRAFANA_TOKEN"),
                      help="service-account token with the Editor role (default: $GRAFANA_TOKEN)")
    push.add_argument("--token-file", type=Path, help="read the token from this file instead (keeps it out of ps)")
    push.add_argument("--folder", default="slotune", help="folder title to put them in (default: %(default)s)")
    push.add_argument("--timeout", type=float, default=10.0, help="seconds per request (default: %(default)s)")


def install(args) -> int:
    try:
        files = dashboards.install(args.dir, args.dashboards_path, args.prometheus_url)
    except OSError as exc:
        print(f"slotune dashboards install: cannot write {exc.filename or args.dir}: {exc.strerror}; "
              "pick a folder you can write to (Grafana's usually needs root)", file=sys.stderr)
        return 1
    for path in files:
        print(path)
    print(f"\nnext: copy {args.dir}/provisioning/*/slotune.yml into Grafana's provisioning folders "
          "(/etc/grafana/provisioning/datasources and .../dashboards) and restart Grafana")
    return 0


def token(args) -> str:
    if args.token_file:
        try:
            return args.token_file.read_text().strip()
        except OSError as exc:
            raise SystemExit(f"slotune dashboards push: cannot read --token-file {args.token_file}: "
                             f"{exc.strerror}") from None
    if not args.token:
        raise SystemExit("slotune dashboards push: no token: pass --token, --token-file or set $GRAFANA_TOKEN "
                         "(Grafana: Administration > Service accounts > add a token with the Editor role)")
    return args.token


def grafana_url(url: str | None) -> str:
    """The base URL with a trailing slash after a path prefix (grafana-client appends 'api')."""
    url = url or ""
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise SystemExit(f"slotune dashboards push: --url {url!r} is not a Grafana URL; "
                         "give one like http://127.0.0.1:3000 (or set $GRAFANA_URL)")
    return url if not parsed.path or parsed.path.endswith("/") else url + "/"


def push(args) -> int:
    from grafana_client import GrafanaApi
    from grafana_client.client import GrafanaClientError, GrafanaException, GrafanaUnauthorizedError
    from niquests.exceptions import RequestException

    url = grafana_url(args.url)
    origin = "{0.scheme}://{0.netloc}".format(urlparse(url))
    api = GrafanaApi.from_url(url, credential=token(args), timeout=args.timeout)
    try:
        ensure_folder(api, args.folder)
        for uid, model in dashboards.all_dashboards().items():
            answer = api.dashboard.update_dashboard({
                "dashboard": {**model, "id": None}, "folderUid": dashboards.FOLDER_UID, "overwrite": True,
                "message": "slotune dashboards push"})
            # Grafana answers the dashboard's path from the server root, sub-path included.
            print(f"{model['title']:<28} {origin}{answer.get('url', '/d/' + uid)}")
    except GrafanaUnauthorizedError:
        print(f"slotune dashboards push: Grafana at {url} refused the token (401); use a service-account "
              "token with the Editor role", file=sys.stderr)
        return 1
    except GrafanaClientError as exc:
        print(f"slotune dashboards push: Grafana at {url} refused the request: {exc.message}", file=sys.stderr)
        return 1
    except (GrafanaException, RequestException) as exc:
        print(f"slotune dashboards push: cannot talk to Grafana at {url}: {getattr(exc, 'message', exc)}",
              file=sys.stderr)
        return 1
    return 0


def ensure_folder(api, title: str) -> None:
    """The slotune folder (uid "slotune"), created with this title when missing."""
    from grafana_client.client import GrafanaClientError
    try:
        api.folder.get_folder(dashboards.FOLDER_UID)
    except GrafanaClientError as exc:
        if exc.status_code != 404:
            raise
        api.folder.create_folder(title, uid=dashboards.FOLDER_UID)


def run(args) -> int:
    return install(args) if args.action == "install" else push(args)
