"""slotune's Grafana dashboards and provisioning files, built from code so all
five share one style: the Prometheus data source is the ${datasource} variable,
panel ids are unique, quantiles come from the recording rules in
dashboards/rules/slotune.rules.yml. `slotune dashboards install|push` use it."""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

DS = {"type": "prometheus", "uid": "${datasource}"}
SCHEMA_VERSION = 39
FOLDER_UID = "slotune"
DEFAULT_DASHBOARDS_PATH = "/var/lib/grafana/dashboards/slotune"
DATASOURCE_UID = "slotune-prometheus"

SVC = 'instance=~"$instance", service=~"$service"'        # the usual label filter
INST = 'instance=~"$instance"'


class Board:
    """One dashboard being laid out: panels flow left to right on a 24-column grid."""

    def __init__(self, uid: str, title: str, description: str, variables: list[dict]):
        self.uid, self.title, self.description = uid, title, description
        self.variables = [datasource_variable()] + variables
        self.annotations: list[dict] = []
        self.panels: list[dict] = []
        self.x = self.y = self.row_h = 0

    def row(self, title: str) -> None:
        self._newline()
        self.panels.append({"id": len(self.panels) + 1, "type": "row", "title": title, "collapsed": False,
                            "gridPos": {"x": 0, "y": self.y, "w": 24, "h": 1}, "panels": []})
        self.y += 1

    def add(self, panel: dict, w: int = 12, h: int = 8) -> dict:
        if self.x + w > 24:
            self._newline()
        panel = {"id": len(self.panels) + 1, **panel, "gridPos": {"x": self.x, "y": self.y, "w": w, "h": h}}
        self.panels.append(panel)
        self.x += w
        self.row_h = max(self.row_h, h)
        return panel

    def _newline(self) -> None:
        self.y += self.row_h
        self.x = self.row_h = 0

    def annotate(self, name: str, expr: str, color: str, title: str) -> None:
        self.annotations.append({"name": name, "datasource": DS, "enable": True, "iconColor": color,
                                 "expr": expr, "step": "30s", "titleFormat": title,
                                 "textFormat": "{{tuner}} tuner on {{service}} ({{instance}})",
                                 "tagKeys": "service,tuner,setting,outcome", "useValueForTime": False})

    def json(self) -> dict:
        return {
            "uid": self.uid, "title": self.title, "description": self.description, "tags": ["slotune"],
            "schemaVersion": SCHEMA_VERSION, "version": 1, "editable": True, "graphTooltip": 1,
            "timezone": "browser", "time": {"from": "now-1h", "to": "now"}, "refresh": "30s",
            "fiscalYearStartMonth": 0, "liveNow": False, "weekStart": "",
            "links": [{"type": "dashboards", "tags": ["slotune"], "asDropdown": True, "title": "slotune",
                       "includeVars": True, "keepTime": True}],
            "templating": {"list": self.variables},
            "annotations": {"list": self.annotations},
            "panels": self.panels,
        }


# ---- variables ---------------------------------------------------------------------------------

def datasource_variable() -> dict:
    return {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
            "current": {}, "hide": 0, "refresh": 1, "regex": "", "options": [], "skipUrlSync": False}


def query_variable(name: str, label: str, query: str, multi: bool = True) -> dict:
    return {"name": name, "label": label, "type": "query", "datasource": DS, "definition": query,
            "query": {"query": query, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
            "refresh": 2, "sort": 1, "hide": 0, "multi": multi, "includeAll": multi,
            "allValue": ".+" if multi else None, "current": {}, "options": [], "regex": "",
            "skipUrlSync": False}


def instance_variable() -> dict:
    return query_variable("instance", "Host", "label_values(slotune_collector_up, instance)")


def service_variable(multi: bool = True) -> dict:
    return query_variable("service", "Service",
                          f"label_values(slotune_service_slo_seconds{{{INST}}}, service)", multi)


# ---- panels ------------------------------------------------------------------------------------

def target(expr: str, legend: str = "", ref: str = "A", instant: bool = False, fmt: str = "time_series") -> dict:
    return {"refId": ref, "datasource": DS, "expr": expr, "legendFormat": legend or "__auto",
            "range": not instant, "instant": instant, "format": fmt}


def targets(queries: list[tuple[str, str]], **kw) -> list[dict]:
    return [target(expr, legend, chr(ord("A") + i), **kw) for i, (expr, legend) in enumerate(queries)]


def timeseries(title: str, queries: list[tuple[str, str]], unit: str, description: str = "",
               stack: bool = False, bars: bool = False, thresholds: Sequence[tuple[float, str]] = (),
               overrides: Sequence[dict] = ()) -> dict:
    custom = {"drawStyle": "bars" if bars else "line", "lineWidth": 1, "fillOpacity": 60 if stack or bars else 10,
              "showPoints": "never", "spanNulls": False,
              "stacking": {"mode": "normal" if stack else "none", "group": "A"},
              "thresholdsStyle": {"mode": "dashed" if thresholds else "off"}}
    return {"type": "timeseries", "title": title, "description": description, "datasource": DS,
            "targets": targets(queries),
            "fieldConfig": {"defaults": {"unit": unit, "custom": custom, "color": {"mode": "palette-classic"},
                                         "thresholds": threshold_steps(thresholds)},
                            "overrides": list(overrides)},
            "options": {"legend": {"displayMode": "table", "placement": "bottom", "showLegend": True,
                                   "calcs": ["lastNotNull", "max"]},
                        "tooltip": {"mode": "multi", "sort": "desc"}}}


def threshold_steps(steps: Sequence[tuple[float, str]], base: str = "green") -> dict:
    return {"mode": "absolute",
            "steps": [{"color": base, "value": None}] + [{"color": c, "value": v} for v, c in steps]}


def dashed(regex: str) -> dict:
    """Override: series whose name matches regex are drawn dashed (objectives, limits)."""
    return {"matcher": {"id": "byRegexp", "options": regex},
            "properties": [{"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}},
                           {"id": "color", "value": {"mode": "fixed", "fixedColor": "red"}}]}


def stat(title: str, queries: list[tuple[str, str]], unit: str, description: str = "",
         thresholds: Sequence[tuple[float, str]] = (), text_mode: str = "value_and_name", base: str = "green") -> dict:
    return {"type": "stat", "title": title, "description": description, "datasource": DS,
            "targets": targets(queries, instant=True),
            "fieldConfig": {"defaults": {"unit": unit, "thresholds": threshold_steps(thresholds, base),
                                         "color": {"mode": "thresholds"}}, "overrides": []},
            "options": {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                        "textMode": text_mode, "colorMode": "background", "graphMode": "none",
                        "justifyMode": "auto", "orientation": "auto"}}


def heatmap(title: str, expr: str, description: str = "") -> dict:
    """A Prometheus histogram's buckets over time (the bucket bounds are the y axis)."""
    return {"type": "heatmap", "title": title, "description": description, "datasource": DS,
            "targets": [target(expr, "{{le}}", fmt="heatmap")],
            "options": {"calculate": False, "cellGap": 1, "yAxis": {"unit": "s", "axisPlacement": "left"},
                        "color": {"mode": "scheme", "scheme": "Oranges", "steps": 64, "exponent": 0.5},
                        "tooltip": {"show": True, "yHistogram": True}, "legend": {"show": True},
                        "rowsFrame": {"layout": "auto"}},
            "fieldConfig": {"defaults": {}, "overrides": []}}


def state_timeline(title: str, queries: list[tuple[str, str]], description: str = "",
                   bad_when: int = 0) -> dict:
    """0/1 gauges as coloured bands; bad_when is the value drawn red."""
    good = 1 - bad_when
    mapping = {"type": "value", "options": {str(bad_when): {"color": "red", "index": 0},
                                            str(good): {"color": "green", "index": 1}}}
    return {"type": "state-timeline", "title": title, "description": description, "datasource": DS,
            "targets": targets(queries),
            "fieldConfig": {"defaults": {"mappings": [mapping], "color": {"mode": "thresholds"},
                                         "thresholds": threshold_steps([])}, "overrides": []},
            "options": {"showValue": "never", "mergeValues": True, "rowHeight": 0.8,
                        "legend": {"showLegend": False}}}


def table(title: str, queries: list[tuple[str, str, str]], sort_by: str, description: str = "") -> dict:
    """Instant queries (expr, column name, unit) merged on their labels, one row per series."""
    rename = {f"Value #{chr(ord('A') + i)}": name for i, (_, name, _) in enumerate(queries)}
    overrides = [{"matcher": {"id": "byName", "options": name}, "properties": [{"id": "unit", "value": unit}]}
                 for _, name, unit in queries]
    return {"type": "table", "title": title, "description": description, "datasource": DS,
            "targets": targets([(expr, "") for expr, _, _ in queries], instant=True, fmt="table"),
            "transformations": [
                {"id": "merge", "options": {}},
                {"id": "organize", "options": {"excludeByName": {"Time": True, "job": True},
                                               "renameByName": rename}},
                {"id": "sortBy", "options": {"fields": {}, "sort": [{"field": sort_by, "desc": True}]}}],
            "fieldConfig": {"defaults": {"custom": {"align": "auto", "cellOptions": {"type": "auto"}}},
                            "overrides": overrides},
            "options": {"showHeader": True, "cellHeight": "sm", "footer": {"show": False}}}


def quantiles(metric: str, labels: str, legend: str, qs: tuple[str, ...] = ("0.5", "0.99")) -> list[tuple[str, str]]:
    """Queries of a recorded quantile series, one per quantile."""
    return [(f'{metric}{{{labels}, quantile="{q}"}}', f"{legend} p{float(q) * 100:g}") for q in qs]


def rate_sum(metric: str, by: str, labels: str = SVC) -> str:
    return f"sum by ({by}) (rate({metric}{{{labels}}}[$__rate_interval]))"


BURN = "service:slotune_slo_burn_rate:ratio_rate"       # recorded burn rates, suffix = window
P99_OVER_SLO = ('max by (instance, service) (slotune_service_latency_seconds{%s, quantile="0.99"} '
                "/ ignoring(quantile) slotune_service_slo_seconds)")


# ---- the dashboards ----------------------------------------------------------------------------

def service_overview() -> dict:
    b = Board("slotune-service", "slotune / Service overview",
              "One service: latency against its P99 objective, throughput, errors, error-budget burn, "
              "and which measured cause explains its tail.", [instance_variable(), service_variable(multi=False)])
    b.row("Latency against the objective")
    b.add(timeseries("P50 / P95 / P99 vs SLO", [
        (f"slotune_service_latency_seconds{{{SVC}}}", "{{service}} p{{quantile}}"),
        (f"slotune_service_slo_seconds{{{SVC}}}", "{{service}} P99 SLO")], "s",
        "Latency quantiles of each collection window; the dashed line is the P99 objective.",
        overrides=[dashed(".*SLO")]), w=16)
    b.add(stat("P99 / SLO now", [(P99_OVER_SLO % SVC, "{{service}}")], "percentunit",
               "Above 100 % the service misses its objective.", [(0.8, "orange"), (1.0, "red")]), w=8)
    b.add(timeseries("Throughput", [(rate_sum("slotune_service_requests_total", "service"), "{{service}}")],
                     "reqps", "Requests answered per second."), w=8)
    b.add(timeseries("Error ratio", [(
        f'{rate_sum("slotune_service_errors_total", "service")} / '
        f'{rate_sum("slotune_service_requests_total", "service")}', "{{service}}")],
        "percentunit", "Share of requests that ended in an error."), w=8)
    b.add(timeseries("Error-budget burn rate", [
        (f"{BURN}{w}{{{SVC}}}", f"{{{{service}}}} {w}") for w in ("5m", "1h", "6h", "1d")], "x",
        "Share of requests slower than the P99 objective, over the 1 % budget: 1 spends the budget exactly "
        "in the SLO period. Pages at 14.4 (1 h) and 6 (6 h); tickets at 3 (1 d).",
        thresholds=[(3, "orange"), (6, "red"), (14.4, "dark-red")]), w=8)
    b.row("Attribution: where the tail comes from")
    b.add(timeseries("Share of the latency growth by cause", [
        (f"slotune_attribution_share_ratio{{{SVC}}}", "{{cause}}")], "percentunit",
        "Each measured cause's share of how far the latency moved over the service's own baseline "
        "(P99, or P50 when every request slowed); empty while nothing moved beyond its noise.", stack=True), w=16)
    b.add(stat("Top cause now", [(f"topk by (instance, service) (1, slotune_attribution_share_ratio{{{SVC}}})",
                                  "{{cause}}")], "percentunit", "The cause that explains most of the tail now."),
          w=8, h=4)
    b.add(stat("Attribution confidence", [(f"slotune_attribution_confidence_ratio{{{SVC}}}", "{{service}}")],
               "percentunit", "How well the measured causes explain the tail (low: an unmeasured cause).",
               [(0.0, "red"), (0.5, "orange"), (0.8, "green")], text_mode="value"), w=8, h=4)
    b.add(timeseries("Latency growth and tail", [
        (f"slotune_attribution_growth_seconds{{{SVC}}}", "growth over baseline"),
        (f"slotune_attribution_excess_seconds{{{SVC}}}", "P99 excess over P50")],
                     "s", "What the shares split (the growth over the baseline) beside the whole tail."), w=12)
    b.add(timeseries("Drift against the baseline", [
        (f"slotune_drift_deviation_ratio{{{SVC}}}", "{{metric}}")], "percentunit",
        "Relative change of each metric against its rolling baseline; the drift alert fires beyond 8 %.",
        thresholds=[(0.08, "red")]), w=12)
    return b.json()


def tuners() -> dict:
    setting = query_variable("setting", "Setting",
                             f"label_values(slotune_setting_value{{{SVC}}}, setting)")
    b = Board("slotune-tuners", "slotune / Tuners",
              "Each tuned setting over time with the tuners' pushes and rollbacks marked, and the inputs the "
              "tuners decided on beside them.", [instance_variable(), service_variable(), setting])
    decisions = f'slotune_tuner_decisions_total{{{SVC}, outcome=~"%s"}}'
    b.annotate("Pushes", f'increase({decisions % "pushed"}[1m]) > 0', "blue", "pushed {{setting}}")
    b.annotate("Rollbacks", f'increase({decisions % "rolled_back|rollback_failed"}[1m]) > 0', "red",
               "{{outcome}}: {{setting}}")
    b.annotate("Failed pushes", f'increase({decisions % "push_failed"}[1m]) > 0', "purple",
               "push failed: {{setting}}")
    b.row("Settings (pushes blue, rollbacks red)")
    panel = b.add(timeseries("$setting", [(f'slotune_setting_value{{{SVC}, setting=~"$setting"}}',
                                           "{{service}}")], "none",
                             "The setting's value as the service reports it after each push."), w=8)
    panel.update({"repeat": "setting", "repeatDirection": "h", "maxPerRow": 3})
    b.row("Decisions")
    b.add(timeseries("Decisions by outcome", [(
        f'sum by (outcome) (increase(slotune_tuner_decisions_total{{{SVC}}}[$__rate_interval]))', "{{outcome}}")],
        "short", "pushed, dry_run, held, refused (out of bounds), rolled_back (made the SLO worse), "
                 "rollback_failed, push_failed.", stack=True, bars=True), w=16)
    b.add(state_timeline("Control surface reachable", [(f"slotune_control_reachable{{{SVC}}}", "{{service}}")],
                         "Whether each service's control API answers (0: pushes cannot land)."), w=8)
    b.row("Tuner inputs")
    b.add(timeseries("P99 vs SLO (throttle, batch)", [
        (f'slotune_service_latency_seconds{{{SVC}, quantile="0.99"}}', "{{service}} p99"),
        (f"slotune_service_slo_seconds{{{SVC}}}", "{{service}} SLO")], "s", overrides=[dashed(".*SLO")]), w=8)
    b.add(timeseries("Throughput and refusals (throttle)", [
        (rate_sum("slotune_service_requests_total", "service"), "{{service}} answered"),
        (f"sum by (job) (rate(gateway_rate_limited_total{{{INST}}}[$__rate_interval]))", "gateway rate-limited"),
        (f"sum by (job) (rate(gateway_concurrency_limited_total{{{INST}}}[$__rate_interval]))",
         "gateway over the concurrency limit"),
        (f"sum by (job) (gateway_inflight_requests{{{INST}}})", "gateway in flight")], "reqps"), w=8)
    b.add(timeseries("Batching (batch)", [
        *quantiles("job:inference_queue_wait_seconds:histogram_quantile", INST, "queue wait"),
        *quantiles("job:inference_batch_compute_seconds:histogram_quantile", INST, "batch compute")], "s",
        "The inference server's queue wait and per-batch model time (its own histograms)."), w=8)
    b.add(timeseries("Batch size (batch)", quantiles("job:inference_batch_size:histogram_quantile", INST,
                                                     "batch size"), "short"), w=8)
    b.add(timeseries("Traces and errors (sampling)", [
        (f"sum by (sampled) (rate(gateway_traces_total{{{INST}}}[$__rate_interval]))", "sampled={{sampled}}"),
        (rate_sum("slotune_service_errors_total", "service"), "{{service}} errors")], "reqps"), w=8)
    b.add(timeseries("Tool failure ratio (breaker)", [(
        f'sum by (tool) (rate(gateway_tool_calls_total{{{INST}, outcome!="ok"}}[$__rate_interval])) / '
        f"sum by (tool) (rate(gateway_tool_calls_total{{{INST}}}[$__rate_interval]))", "{{tool}}"),
        (f"max by (tool) (gateway_breaker_open{{{INST}}})", "{{tool}} breaker open")], "percentunit",
        "Failed tool calls over all tool calls, against the 0.3 % objective; breaker open is 1 while open.",
        thresholds=[(0.003, "red")]), w=8)
    return b.json()


def kernel() -> dict:
    peer = query_variable("peer", "Peer", f"label_values(slotune_tcp_rtt_seconds_count{{{SVC}}}, peer)")
    b = Board("slotune-kernel", "slotune / Kernel",
              "What the eBPF probes see per service and peer: run-queue wait, off-CPU time by syscall class, "
              "TCP RTT, retransmits and connects, TLS handshakes, HTTP latency from the kernel.",
              [instance_variable(), service_variable(), peer])
    peer_filter = f'{SVC}, peer=~"$peer"'
    b.row("CPU")
    b.add(timeseries("Run-queue wait", quantiles("service:slotune_runqueue_wait_seconds:histogram_quantile",
                                                 SVC, "{{service}}"), "s",
                     "Time runnable tasks waited for a CPU (scheduler latency)."))
    b.add(heatmap("Run-queue wait distribution", "sum by (le) (increase("
                  f"slotune_runqueue_wait_seconds_bucket{{{SVC}}}[$__rate_interval]))"))
    b.add(timeseries("Off-CPU time by syscall class", [(rate_sum("slotune_offcpu_seconds_sum", "syscall"),
                                                        "{{syscall}}")], "s",
                     "Seconds per second the service's tasks spent blocked inside syscalls.", stack=True))
    b.add(timeseries("Off-CPU P99 by syscall class", quantiles(
        "service:slotune_offcpu_seconds:histogram_quantile", SVC, "{{service}} {{syscall}}", ("0.99",)), "s"))
    b.row("TCP")
    b.add(heatmap("TCP RTT distribution", "sum by (le) (increase("
                  f"slotune_tcp_rtt_seconds_bucket{{{peer_filter}}}[$__rate_interval]))",
                  "Smoothed RTT of every received segment."))
    b.add(timeseries("TCP RTT by peer", quantiles("service:slotune_tcp_rtt_seconds:histogram_quantile",
                                                  peer_filter, "{{service}} → {{peer}}"), "s"))
    b.add(timeseries("Retransmits", [(rate_sum("slotune_tcp_retransmits_total", "service, peer", peer_filter),
                                      "{{service}} → {{peer}}")], "pps", "Retransmitted segments per second."),
          w=8)
    b.add(timeseries("Connections", [
        (rate_sum("slotune_tcp_connections_opened_total", "service, peer", peer_filter), "{{service}} → {{peer}} opened"),
        (rate_sum("slotune_tcp_connections_closed_total", "service, peer", peer_filter), "{{service}} → {{peer}} closed")],
        "cps", "A high open rate means connections are not reused: each pays a handshake."), w=8)
    b.add(timeseries("Connect time", quantiles("service:slotune_tcp_connect_seconds:histogram_quantile",
                                               peer_filter, "{{service}} → {{peer}}"), "s",
                     "SYN sent to established, outgoing connections."), w=8)
    b.row("TLS and HTTP")
    b.add(timeseries("TLS handshakes", quantiles("service:slotune_tls_handshake_seconds:histogram_quantile",
                                                 SVC, "{{service}}") +
                     [(rate_sum("slotune_tls_handshake_seconds_count", "service"), "{{service}} per second")], "s",
                     "SSL_do_handshake latency in the service's libssl, and handshakes per second (right axis).",
                     overrides=[{"matcher": {"id": "byRegexp", "options": ".*per second"},
                                 "properties": [{"id": "unit", "value": "ops"},
                                                {"id": "custom.axisPlacement", "value": "right"}]}]), w=8)
    b.add(timeseries("TLS plaintext throughput", [(rate_sum("slotune_tls_bytes_total", "service, direction"),
                                                   "{{service}} {{direction}}")], "Bps"), w=8)
    b.add(timeseries("HTTP latency seen from the kernel", quantiles(
        "service:slotune_http_request_duration_seconds:histogram_quantile", SVC, "{{service}}",
        ("0.5", "0.95", "0.99")), "s", "First read of a request to its response write."), w=8)
    b.row("Probes")
    b.add(state_timeline("Probes attached", [(f"slotune_probe_attached{{{INST}}}", "{{probe}}")],
                         "Each kernel probe: green attached, red detached (its signals are missing)."), w=16)
    b.add(stat("Processes found per service", [(f"slotune_service_processes{{{SVC}}}", "{{service}}")], "none",
               "0 means the service's finders match no process.", [(1, "green")], base="red"), w=8)
    b.add(timeseries("CPU the probes take", [(rate_sum("slotune_bpf_program_run_seconds_total", "program", INST),
                                              "{{program}}")], "percentunit",
                     "Share of one CPU the kernel spent running each slotune BPF program. Counted only while "
                     "kernel.bpf_stats_enabled is 1, which itself adds ~20-30 ns to every BPF program run.",
                     stack=True))
    b.add(timeseries("Time per probe run", [(
        f'{rate_sum("slotune_bpf_program_run_seconds_total", "program", INST)} / '
        f'{rate_sum("slotune_bpf_program_runs_total", "program", INST)}', "{{program}}")], "s",
        "Mean time of one run of each slotune BPF program, as the kernel times it."))
    return b.json()


def gpu() -> dict:
    gpu_var = query_variable("gpu", "GPU", f"label_values(slotune_gpu_up{{{INST}}}, gpu)")
    b = Board("slotune-gpu", "slotune / GPU",
              "NVML per GPU and per service: utilisation, memory bandwidth, PCIe, clocks and throttle reasons, "
              "power, temperature, errors.", [instance_variable(), gpu_var, service_variable()])
    g = f'{INST}, gpu=~"$gpu"'
    legend = "GPU {{gpu}}"
    b.row("Load")
    b.add(timeseries("Utilisation", [(f"slotune_gpu_utilization_ratio{{{g}}}", f"{legend} SM busy"),
                                     (f"slotune_gpu_memory_copy_utilization_ratio{{{g}}}", f"{legend} memory copy"),
                                     (f"slotune_gpu_dram_bandwidth_utilization_ratio{{{g}}}", f"{legend} DRAM bandwidth")],
                     "percentunit"))
    b.add(timeseries("Device memory", [(f"slotune_gpu_framebuffer_used_bytes{{{g}}}", f"{legend} used"),
                                       (f"slotune_gpu_framebuffer_free_bytes{{{g}}}", f"{legend} free")], "bytes",
                     stack=True))
    b.add(timeseries("PCIe", [(f"slotune_gpu_pcie_tx_bytes_per_second{{{g}}}", f"{legend} tx"),
                              (f"slotune_gpu_pcie_rx_bytes_per_second{{{g}}}", f"{legend} rx")], "Bps"), w=8)
    b.add(timeseries("Clocks", [(f"slotune_gpu_sm_clock_hertz{{{g}}}", f"{legend} SM"),
                                (f"slotune_gpu_memory_clock_hertz{{{g}}}", f"{legend} memory")], "hertz"), w=8)
    b.add(state_timeline("Clock event reasons (throttling)", [(
        f"slotune_gpu_clock_event_active{{{g}}}", "{{gpu}} {{reason}}")],
        "Red while the reason holds the clocks down.", bad_when=1), w=8)
    b.row("Power and health")
    b.add(timeseries("Power", [(f"slotune_gpu_power_watts{{{g}}}", legend),
                               (f"rate(slotune_gpu_energy_joules_total{{{g}}}[$__rate_interval])",
                                f"{legend} from energy")], "watt"), w=8)
    b.add(timeseries("Temperature", [(f"slotune_gpu_temperature_celsius{{{g}}}", legend)], "celsius"), w=8)
    b.add(state_timeline("GPU answering", [(f"slotune_gpu_up{{{g}}}", legend)],
                         "Red once the GPU is lost (XID 79)."), w=8)
    b.add(timeseries("ECC and XID errors", [
        (f"sum by (gpu, type) (increase(slotune_gpu_ecc_errors_total{{{g}}}[$__rate_interval]))", "{{gpu}} ECC {{type}}"),
        (f"sum by (gpu, xid) (increase(slotune_gpu_xid_errors_total{{{g}}}[$__rate_interval]))", "{{gpu}} XID {{xid}}")],
        "short", bars=True), w=24)
    b.row("Per service")
    b.add(timeseries("GPU share by service", [(
        f'slotune_gpu_service_utilization_ratio{{{SVC}, gpu=~"$gpu"}}', "{{service}} on GPU {{gpu}}")],
        "percentunit", stack=True))
    b.add(timeseries("Device memory by service", [(
        f'slotune_gpu_service_memory_bytes{{{SVC}, gpu=~"$gpu"}}', "{{service}} on GPU {{gpu}}")],
        "bytes", stack=True))
    return b.json()


def fleet() -> dict:
    b = Board("slotune-fleet", "slotune / Fleet",
              "The key figures across hosts, worst services first.", [instance_variable()])
    ratio = P99_OVER_SLO % INST
    b.add(table("Services, worst first", [
        (ratio, "P99 / SLO", "percentunit"),
        (f"max by (instance, service) ({BURN}1h{{{INST}}})", "burn 1h", "x"),
        (f"sum by (instance, service) (rate(slotune_service_requests_total{{{INST}}}[5m]))", "req/s", "reqps"),
        (f"sum by (instance, service) (rate(slotune_service_errors_total{{{INST}}}[5m])) / "
         f"sum by (instance, service) (rate(slotune_service_requests_total{{{INST}}}[5m]))", "errors", "percentunit")],
        "P99 / SLO", "One row per service and host, sorted by P99 over its objective."), w=16, h=10)
    b.add(table("Top cause per service", [(
        f"topk by (instance, service) (1, slotune_attribution_share_ratio{{{INST}}})", "share", "percentunit")],
        "share", "The cause that explains most of each service's tail now."), w=8, h=10)
    b.add(table("Hosts slower than their fleet", [
        (f"max by (instance, service) (service:slotune_host_outlier:robust_z{{{INST}}})", "robust z", "none"),
        (f"max by (instance, service) (exp(service:slotune_service_latency_p99_seconds:ln_avg10m{{{INST}}}))",
         "P99 (10 m)", "s")],
        "robust z", "Each host's P99 against the same service on the other hosts (median and MAD of the "
        "fleet, docs/fleet.md); SlotuneHostOutlier fires above 3.5 for 10 minutes."), w=24, h=8)
    b.add(timeseries("Worst P99 / SLO per host", [(f"max by (instance) ({ratio})", "{{instance}}")],
                     "percentunit", thresholds=[(1.0, "red")]))
    b.add(timeseries("Requests per host", [(f"sum by (instance) (rate(slotune_service_requests_total{{{INST}}}"
                                             "[$__rate_interval]))", "{{instance}}")], "reqps"))
    b.add(timeseries("Rollbacks per host", [(
        f'sum by (instance) (increase(slotune_tuner_decisions_total{{{INST}, outcome=~"rolled_back|rollback_failed"}}'
        f"[1h])) or count by (instance) (slotune_collector_up{{{INST}}}) * 0", "{{instance}}")], "short",
        "Pushes undone (or failed to undo) because they made the SLO worse, last hour; 0 on hosts with none."), w=8)
    b.add(timeseries("Collectors down per host", [(
        f"count by (instance) (slotune_collector_up{{{INST}}} == 0) or count by (instance) (slotune_collector_up{{{INST}}}) * 0",
        "{{instance}}")], "short", "Collectors that are not running (nvml is down on hosts without a GPU)."), w=8)
    b.add(timeseries("Drift alerts per host", [(f"sum by (instance) (slotune_drift_alert{{{INST}}})",
                                                 "{{instance}}")], "short",
                     "Service metrics drifting from their baseline now."), w=8)
    return b.json()


DASHBOARDS = {"slotune-service": service_overview, "slotune-tuners": tuners, "slotune-kernel": kernel,
              "slotune-gpu": gpu, "slotune-fleet": fleet}


def all_dashboards() -> dict[str, dict]:
    """uid -> dashboard JSON model."""
    return {uid: build() for uid, build in DASHBOARDS.items()}


# ---- provisioning (Grafana's documented format: apiVersion 1) ----------------------------------

def datasource_provisioning(prometheus_url: str = "http://127.0.0.1:9090") -> str:
    return f"""# Grafana data source provisioning for slotune (copy to /etc/grafana/provisioning/datasources/).
# Generated by `slotune dashboards install`; the dashboards choose their data source through the
# ${{datasource}} variable, so any Prometheus that scrapes slotune works, this one is a starting point.
apiVersion: 1

datasources:
  - name: Prometheus (slotune)
    type: prometheus
    uid: {DATASOURCE_UID}
    access: proxy
    url: {prometheus_url}
    isDefault: false
    editable: true
    jsonData:
      httpMethod: POST
      timeInterval: 15s
"""


def dashboards_provisioning(path: str = DEFAULT_DASHBOARDS_PATH) -> str:
    return f"""# Grafana dashboard provider for slotune (copy to /etc/grafana/provisioning/dashboards/).
# Generated by `slotune dashboards install`; Grafana loads every dashboard JSON under options.path
# into the "slotune" folder and reloads them when the files change.
apiVersion: 1

providers:
  - name: slotune
    orgId: 1
    folder: slotune
    folderUid: {FOLDER_UID}
    type: file
    disableDeletion: false
    allowUiUpdates: false
    updateIntervalSeconds: 30
    options:
      path: {path}
      foldersFromFilesStructure: false
"""


def install(directory: Path, dashboards_path: str | None = None,
            prometheus_url: str = "http://127.0.0.1:9090") -> list[Path]:
    """Write <dir>/<uid>.json and <dir>/provisioning/{datasources,dashboards}/slotune.yml; returns the files."""
    directory = Path(directory)
    files = {directory / f"{uid}.json": json.dumps(model, indent=2) + "\n" for uid, model in all_dashboards().items()}
    files[directory / "provisioning" / "datasources" / "slotune.yml"] = datasource_provisioning(prometheus_url)
    files[directory / "provisioning" / "dashboards" / "slotune.yml"] = dashboards_provisioning(
        dashboards_path or str(directory.resolve()))
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return list(files)
