"""Many hosts on one machine, each a network namespace with its own stack and slotune daemon.

Each "host" runs its own reference stack (smallest model) and daemon, exporting on the
namespace's address; one Prometheus in ours scrapes them all, each target labelled
instance=hostN, with slotune's rules loaded. A steady trickle of requests goes to each host's inference server from inside its
namespace. The CPU fault throttles one host's inference server to a share of one CPU (a cgroup
CPU quota: what a noisy neighbour or a CPU limit does to it). Used by tests/e2e/test_fleet.py
and `slotune demo --fleet N`; by hand (as root), through bench/fleet.py:

    python -m bench.fleet --hosts 3 --slow host2     # up, a row per host every 10 s, Ctrl-C stops
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from reference_stack import launcher

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "dashboards" / "rules" / "slotune.rules.yml"
FLEET_BOARD = ROOT / "dashboards" / "slotune-fleet.json"
EXPORTER_PORT = 9477
CGROUP_CPU = Path("/sys/fs/cgroup/cpu")     # cgroup v1 cpu controller (cgroup v2: cpu.max below)
CGROUP_V2 = Path("/sys/fs/cgroup")


def sh(*cmd: str) -> str:
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}): {out.stderr.strip()}")
    return out.stdout


@dataclass
class Host:
    name: str                     # the instance label Prometheus gives it: host1 .. hostN
    netns: str
    addr: str                     # its address on the veth pair, where its daemon's exporter listens
    work: Path                    # stack run dir, daemon config, logs
    state: dict = field(default_factory=dict)      # the stack's state.json
    procs: list[subprocess.Popen] = field(default_factory=list)   # daemon and load, ours to stop
    cgroup: Path | None = None    # set while the CPU fault holds its inference server

    def in_ns(self, *argv: str) -> list[str]:
        return ["ip", "netns", "exec", self.netns, *argv]


def daemon_config(host: Host) -> str:
    """Only the inference server, no tuners and no kernel probes: the fleet is about the export."""
    port = host.state["ports"]["inference"]
    run_dir = re.escape(str(host.work / "stack"))
    return f"""# slotune on fleet host {host.name} (network namespace {host.netns})
[daemon]
collect_interval_s = 1.0
tune_interval_s = 5.0
exporter_address = "{host.addr}:{EXPORTER_PORT}"
baseline_store = "{host.work}/baselines.sqlite"
audit_log = "{host.work}/audit.jsonl"
state_file = "{host.work}/state.json"
environment = "fleet"
probes = []

[services.inference]
cmdline = 'reference_stack inference .*--run-dir {run_dir}( |$)'
port = {port}
slo_p99_ms = 1000
metrics_url = "http://127.0.0.1:{port}/metrics"
latency_metric = "inference_request_duration_seconds"
"""


def prometheus_config(hosts: list[Host], rules: Path, interval_s: float) -> str:
    return yaml.safe_dump({
        "global": {"scrape_interval": f"{interval_s:g}s", "evaluation_interval": f"{interval_s:g}s"},
        "rule_files": [str(rules)],
        "scrape_configs": [{"job_name": "slotune", "static_configs": [
            {"targets": [f"{h.addr}:{EXPORTER_PORT}"], "labels": {"instance": h.name}} for h in hosts]}]},
        sort_keys=False)


def rules_with_for(rules: Path, out: Path, alert: str, for_: str) -> Path:
    """A copy of the rules in which only this alert's `for:` differs (tests and the demo cannot wait 10 m)."""
    doc = yaml.safe_load(rules.read_text())
    found = [r for g in doc["groups"] for r in g["rules"] if r.get("alert") == alert]
    if len(found) != 1:
        raise RuntimeError(f"{rules}: expected one alert {alert!r}, found {len(found)}")
    found[0]["for"] = for_
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out


class Fleet:
    """start() brings every host and Prometheus up (or nothing: a failure stops what started)."""

    def __init__(self, hosts: int, work: Path, *, rules: Path = RULES, rate_per_s: float = 4.0,
                 interval_s: float = 2.0):
        if not 1 <= hosts <= 50:
            raise ValueError(f"--hosts {hosts}: a fleet on one machine has 1 to 50 hosts")
        tag = uuid.uuid4().hex[:5]
        subnet = 100 + uuid.uuid4().int % 100
        self.work, self.rules, self.rate, self.interval = Path(work), Path(rules), rate_per_s, interval_s
        self.hosts = [Host(f"host{i + 1}", f"sltf{tag}{i}", f"10.{subnet}.{i + 1}.2", self.work / f"host{i + 1}")
                      for i in range(hosts)]
        self.prometheus: subprocess.Popen | None = None
        self.prometheus_url = ""

    def __enter__(self) -> "Fleet":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def host(self, name: str) -> Host:
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(f"no host {name!r} in this fleet; hosts: {', '.join(h.name for h in self.hosts)}")

    def start(self) -> None:
        for tool in ("ip", "prometheus"):
            if not shutil.which(tool):
                raise RuntimeError(f"{tool} is missing; install it (apt-get install iproute2 prometheus)")
        try:
            for h in self.hosts:
                self._namespace(h)
            self._stacks()
            for h in self.hosts:
                self._daemon(h)
            for h in self.hosts:
                self._wait_exporter(h)
                h.procs.append(self._spawn(h, "load", h.in_ns(
                    sys.executable, "-m", "slotune.demo.fleet_hosts", "load", "--rate", str(self.rate),
                    "--url", f"http://127.0.0.1:{h.state['ports']['inference']}/generate")))
            self._prometheus()
        except BaseException:
            self.stop()
            raise

    def _namespace(self, h: Host) -> None:
        h.work.mkdir(parents=True, exist_ok=True)
        subnet = h.addr.rsplit(".", 1)[0]
        sh("ip", "netns", "add", h.netns)
        sh("ip", "link", "add", f"{h.netns}a", "type", "veth", "peer", "name", f"{h.netns}b")
        sh("ip", "link", "set", f"{h.netns}b", "netns", h.netns)
        sh("ip", "addr", "add", f"{subnet}.1/24", "dev", f"{h.netns}a")
        sh("ip", "-n", h.netns, "addr", "add", f"{h.addr}/24", "dev", f"{h.netns}b")
        sh("ip", "link", "set", f"{h.netns}a", "up")
        sh("ip", "-n", h.netns, "link", "set", f"{h.netns}b", "up")
        sh("ip", "-n", h.netns, "link", "set", "lo", "up")

    def _stacks(self) -> None:
        """Every host's stack at once, each started inside its namespace on the default ports."""
        starts = {h.name: subprocess.Popen(h.in_ns(sys.executable, "-m", "slotune.demo.fleet_hosts", "stack",
                                                   "--run-dir", str(h.work / "stack")),
                                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
                  for h in self.hosts}
        failed = []
        for h in self.hosts:
            out, err = starts[h.name].communicate(timeout=300)
            if starts[h.name].returncode:
                failed.append(f"{h.name}: {err.strip()[-1500:]}")
            else:
                h.state = json.loads(out)
        if failed:
            raise RuntimeError("a fleet host's stack did not start:\n" + "\n".join(failed))

    def _spawn(self, h: Host, what: str, argv: list[str]) -> subprocess.Popen:
        with open(h.work / f"{what}.log", "ab") as log:
            return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=ROOT)

    def _daemon(self, h: Host) -> None:
        (h.work / "slotune.toml").write_text(daemon_config(h))
        h.procs.append(self._spawn(h, "daemon", h.in_ns(sys.executable, "-m", "slotune.cli", "run",
                                                        "--config", str(h.work / "slotune.toml"))))

    def _wait_exporter(self, h: Host, timeout_s: float = 90) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with urllib.request.urlopen(f"http://{h.addr}:{EXPORTER_PORT}/metrics", timeout=3):
                    return
            except OSError:
                if h.procs[0].poll() is not None or time.monotonic() > deadline:
                    log = (h.work / "daemon.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"slotune on {h.name} did not come up; {h.work / 'daemon.log'} ends:\n"
                                       f"{log}") from None
                time.sleep(0.5)

    def _prometheus(self) -> None:
        port = launcher.free_ports(1)[0]
        cfg = self.work / "prometheus.yml"
        cfg.write_text(prometheus_config(self.hosts, self.rules, self.interval))
        with open(self.work / "prometheus.log", "ab") as log:
            self.prometheus = subprocess.Popen(
                ["prometheus", f"--config.file={cfg}", f"--storage.tsdb.path={self.work / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
        self.prometheus_url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:     # until it has scraped every host once
            try:
                if len(self.query('up{job="slotune"} == 1')) == len(self.hosts):
                    return
            except OSError:
                pass
            if self.prometheus.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Prometheus did not scrape every host in 60 s; see {self.work / 'prometheus.log'}")
            time.sleep(0.5)

    def slow_down(self, name: str, cpu_share: float = 0.02) -> None:
        """The CPU fault: the host's inference server gets cpu_share of one CPU (a cgroup CPU quota)."""
        if not 0.01 <= cpu_share <= 1:
            raise ValueError(f"cpu_share {cpu_share}: give a share of one CPU between 0.01 and 1")
        h = self.host(name)
        pid = h.state["pids"]["inference"]
        if CGROUP_CPU.is_dir():
            h.cgroup = CGROUP_CPU / f"slotune-{h.netns}"
            h.cgroup.mkdir(exist_ok=True)
            (h.cgroup / "cpu.cfs_period_us").write_text("100000")
            (h.cgroup / "cpu.cfs_quota_us").write_text(str(int(cpu_share * 100_000)))
        else:
            h.cgroup = CGROUP_V2 / f"slotune-{h.netns}"
            h.cgroup.mkdir(exist_ok=True)
            (h.cgroup / "cpu.max").write_text(f"{int(cpu_share * 100_000)} 100000")
        (h.cgroup / "cgroup.procs").write_text(str(pid))

    def _release(self, h: Host) -> None:
        if h.cgroup is None or not h.cgroup.is_dir():
            return
        parent = h.cgroup.parent / "cgroup.procs"
        for pid in (h.cgroup / "cgroup.procs").read_text().split():
            try:
                parent.write_text(pid)
            except OSError:
                pass     # it exited meanwhile
        h.cgroup.rmdir()
        h.cgroup = None

    def stop(self) -> None:
        """Everything this fleet started, in reverse; what was never started is skipped."""
        if self.prometheus and self.prometheus.poll() is None:
            self.prometheus.terminate()
            self.prometheus.wait(timeout=20)
        for h in self.hosts:
            for p in h.procs:
                if p.poll() is None:
                    p.terminate()
            for p in h.procs:
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(timeout=10)
            self._release(h)
            if h.state:
                launcher.stop(Path(h.state["run_dir"]))
            subprocess.run(["ip", "link", "del", f"{h.netns}a"], capture_output=True)
            subprocess.run(["ip", "netns", "del", h.netns], capture_output=True)

    # ---- reading the fleet back from Prometheus ----------------------------------------------

    def query(self, promql: str) -> list[dict]:
        url = f"{self.prometheus_url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=10) as resp:
            body = json.loads(resp.read())
        if body.get("status") != "success":
            raise RuntimeError(f"Prometheus refused {promql!r}: {body}")
        return body["data"]["result"]

    def alerts(self, name: str = "SlotuneHostOutlier") -> list[dict]:
        with urllib.request.urlopen(self.prometheus_url + "/api/v1/alerts", timeout=10) as resp:
            return [a for a in json.loads(resp.read())["data"]["alerts"] if a["labels"].get("alertname") == name]

    def hosts_worst_first(self) -> list[dict]:
        """The fleet dashboard's 'Hosts slower than their fleet' table as Grafana shows it: its queries
        for every host, merged on (instance, service), sorted by its sort column, highest first."""
        board = json.loads(FLEET_BOARD.read_text())
        panel = next(p for p in board["panels"] if p.get("title") == "Hosts slower than their fleet")
        names = next(t for t in panel["transformations"] if t["id"] == "organize")["options"]["renameByName"]
        sort = next(t for t in panel["transformations"] if t["id"] == "sortBy")["options"]["sort"][0]["field"]
        rows: dict[tuple, dict] = {}
        for i, target in enumerate(panel["targets"]):
            column = names[f"Value #{chr(ord('A') + i)}"]
            for series in self.query(target["expr"].replace("$instance", ".+")):
                key = (series["metric"]["instance"], series["metric"]["service"])
                rows.setdefault(key, {"instance": key[0], "service": key[1]})[column] = float(series["value"][1])
        return sorted(rows.values(), key=lambda r: r.get(sort, float("-inf")), reverse=True)


# ---- what runs inside a host's namespace ----------------------------------------------------------

def start_stack(run_dir: Path) -> int:
    """Start one host's stack on the default ports (each namespace has its own) and print its state."""
    cfg = launcher.StackConfig(run_dir=run_dir, inference_args=list(launcher.SMALL_MODEL),
                               settings={"inference": {"max_batch_size": 4}})
    try:
        print(json.dumps(launcher.start(cfg)))
    except RuntimeError as e:
        print(f"fleet stack in {run_dir}: {e}", file=sys.stderr)
        return 1
    return 0


def load(url: str, rate: float) -> int:
    """POST /generate at `rate` a second (one thread per request, at most 16 in flight), until killed."""
    body = json.dumps({"prompt": "how warm is it in Lisbon", "max_new_tokens": 4}).encode()
    inflight = threading.BoundedSemaphore(16)

    def one():
        try:
            req = urllib.request.Request(url, body, {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=30) as resp:
                resp.read()
        except OSError:
            pass          # the server's own histogram counts what it served; a refused request is not ours
        finally:
            inflight.release()

    step, due = 1 / rate, time.monotonic()
    while True:
        due += step
        time.sleep(max(0.0, due - time.monotonic()))
        if inflight.acquire(blocking=False):
            threading.Thread(target=one, daemon=True).start()


def print_rows(fleet: Fleet) -> None:
    rows = fleet.hosts_worst_first()
    firing = {(a["labels"]["instance"], a["labels"]["service"]): a["state"] for a in fleet.alerts()}
    print(f"{'host':<8} {'service':<10} {'P99 (10 m)':>10} {'robust z':>9}  SlotuneHostOutlier")
    for r in rows:
        p99 = r.get("P99 (10 m)")
        print(f"{r['instance']:<8} {r['service']:<10} {'' if p99 is None else f'{p99 * 1000:.0f} ms':>10} "
              f"{r.get('robust z', float('nan')):>9.1f}  {firing.get((r['instance'], r['service']), '-')}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.fleet", description=__doc__.splitlines()[0],
                                 epilog="example (as root): python -m bench.fleet --hosts 3 --slow host2")
    sub = ap.add_subparsers(dest="command")
    st = sub.add_parser("stack", help="(inside a host's namespace) start its stack, print its state")
    st.add_argument("--run-dir", type=Path, required=True)
    ld = sub.add_parser("load", help="(inside a host's namespace) steady requests to its inference server")
    ld.add_argument("--url", required=True)
    ld.add_argument("--rate", type=float, default=4.0)
    ap.add_argument("--hosts", type=int, default=3, help="how many hosts (default 3; the score needs 3)")
    ap.add_argument("--slow", help="the host to slow down with the CPU fault (e.g. host2)")
    ap.add_argument("--cpu-share", type=float, default=0.02, help="its inference server's share of one CPU")
    ap.add_argument("--work", type=Path, default=Path("/tmp/slotune-fleet"), help="stacks, configs, logs")
    args = ap.parse_args(argv)
    if args.command == "stack":
        return start_stack(args.run_dir)
    if args.command == "load":
        return load(args.url, args.rate)
    args.work.mkdir(parents=True, exist_ok=True)
    rules = rules_with_for(RULES, args.work / "rules.yml", "SlotuneHostOutlier", "1m")
    with Fleet(args.hosts, args.work, rules=rules) as fleet:
        print(f"fleet of {args.hosts} up; Prometheus {fleet.prometheus_url}; logs in {args.work}")
        if args.slow:
            fleet.slow_down(args.slow, args.cpu_share)
        try:
            while True:
                time.sleep(10)
                print_rows(fleet)
        except KeyboardInterrupt:
            return 0


if __name__ == "__main__":
    sys.exit(main())
