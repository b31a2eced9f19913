"""Each profile read through the real collector over real HTTP. The engines that
cannot run here (vLLM, SGLang, TGI, Triton, Envoy, LiteLLM) are stood in for by a
plain HTTP server answering exposition text written from each project's
documentation (tests/profiles/exposition.py names the page); HAProxy (its built-in
Prometheus exporter) and nginx (stub_status) are the real servers, with real requests
through them. Then what the config and the control loop make of profiles: refusals
naming the key and the fix, restart-only settings recommended, admission at a proxy."""
import http.server
import json
import math
import shutil
import threading
import urllib.request

import numpy as np
import pytest

from slotune import config
from slotune.actuators import ACTUATORS
from slotune.collectors.service_metrics import ServiceMetricsCollector
from slotune.actuators.file import FileActuator
from slotune.store.audit import AuditLog, Outcome
from slotune.control.loop import ControlLoop
from slotune.model import window
from slotune.model.histogram import Histogram
from slotune.model.interval import Interval
from slotune.model.service import ServiceSpec
from tests.actuators import real_servers
from tests.profiles import exposition


class Exposition(http.server.ThreadingHTTPServer):
    """Answers GET with body_of(n) for its n-th request."""

    def __init__(self, body_of):
        self.body_of, self.served = body_of, 0

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(handler):
                self.served += 1
                body = self.body_of(self.served).encode()
                handler.send_response(200)
                handler.send_header("Content-Type", "text/plain; version=0.0.4")
                handler.send_header("Content-Length", str(len(body)))
                handler.end_headers()
                handler.wfile.write(body)

            def log_message(handler, *args):
                pass
        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/metrics"


def one_interval(profile: str, url: str, between=lambda: None, **spec):
    """The Sample of one interval (two scrapes) of a service with this profile."""
    collector = ServiceMetricsCollector(timeout_s=3.0)
    try:
        collector.start([ServiceSpec("svc", port=1, metrics_url=url, profile=profile, **spec)])
        assert collector.collect(0.0, 1.0) == []
        between()
        got = collector.collect(1.0, 2.0)
    finally:
        collector.close()
    assert len(got) == 1, f"no sample from {url}"
    return got[0]


@pytest.fixture
def stand_in():
    servers = []

    def start(body_of):
        servers.append(Exposition(body_of))
        return servers[-1].url
    yield start
    for s in servers:
        s.shutdown()
        s.server_close()


def hist(sample, fam):
    found = [h for (f, _), h in sample.histograms.items() if f == fam]
    assert len(found) == 1, (fam, sorted(sample.histograms))
    return found[0]


def value(table, fam):
    found = [v for (f, _), v in table.items() if f == fam]
    assert len(found) == 1, (fam, sorted(table))
    return found[0]


def test_vllm_from_its_documented_metrics(stand_in):
    s = one_interval("vllm", stand_in(exposition.vllm))
    e2e = hist(s, "vllm_request_duration_seconds")
    assert e2e.count == 10 and 1.0 < e2e.quantile(0.99) <= 2.5 and e2e.quantile(0.5) <= 0.5
    assert hist(s, "vllm_time_to_first_token_seconds").count == 10
    assert hist(s, "vllm_inter_token_latency_seconds").count == 100
    assert hist(s, "vllm_queue_wait_seconds").quantile(0.99) <= 0.02
    assert value(s.gauges, "vllm_num_requests_running") == 3
    assert value(s.gauges, "vllm_num_requests_waiting") == 4
    assert value(s.gauges, "vllm_inflight_requests") == 7
    assert value(s.gauges, "vllm_kv_cache_usage_ratio") == pytest.approx(0.42)
    assert value(s.counters, "vllm_errors_total") == 2          # finished_reason "abort" and "error"
    assert sum(v for (f, _), v in s.counters.items() if f == "vllm_requests_total") == 11
    assert value(s.counters, "vllm_num_preemptions_total") == 2
    steps = hist(s, "vllm_iteration_tokens")
    assert steps.count == 40 and steps.quantile(0.99) <= 8
    assert not any(f.startswith("vllm:") for f, _ in [*s.histograms, *s.gauges, *s.counters])


def test_vllm_windows_take_latency_ttft_and_tpot_from_the_profile(stand_in, tmp_path):
    url = stand_in(exposition.vllm)
    cfg = load(tmp_path, f'[services.llm]\nport = 8000\nprofile = "vllm"\nmetrics_url = "{url}"\n'
                         "slo_ttft_p99_ms = 500.0\nslo_tpot_p99_ms = 50.0\n")
    spec = cfg.service("llm").spec
    assert (spec.latency_metric, spec.ttft_metric, spec.tpot_metric) == (
        "vllm_request_duration_seconds", "vllm_time_to_first_token_seconds", "vllm_inter_token_latency_seconds")
    s = one_interval("vllm", url, latency_metric=spec.latency_metric, ttft_metric=spec.ttft_metric,
                     tpot_metric=spec.tpot_metric)
    w = window.build(spec, 1.0, 2.0, [s])
    assert w.latency_source == "service" and w.requests == 10
    assert w.ttft.count == 10 and w.tpot.count == 100
    assert w.ttft_miss_ratio == pytest.approx(0.1 * (1 - (0.5 - 0.5) / 0.5), abs=0.02)   # 1 of 10 in 0.5..1 s


def test_sglang_reads_the_older_per_token_histogram_when_the_newer_is_absent(stand_in):
    s = one_interval("sglang", stand_in(exposition.sglang))
    assert hist(s, "sglang_inter_token_latency_seconds").count == 64
    assert hist(s, "sglang_request_duration_seconds").count == 8
    assert value(s.gauges, "sglang_inflight_requests") == 7
    assert value(s.gauges, "sglang_kv_cache_usage_ratio") == pytest.approx(0.28)
    assert value(s.counters, "sglang_errors_total") == 1


def test_tgi_counters_without_total_are_read(stand_in):
    s = one_interval("tgi", stand_in(exposition.tgi))
    assert value(s.counters, "tgi_requests_total") == 6
    assert value(s.counters, "tgi_errors_total") == 1
    assert hist(s, "tgi_queue_wait_seconds").count == 6
    assert value(s.gauges, "tgi_num_requests_waiting") == 3 and value(s.gauges, "tgi_inflight_requests") == 7


def test_triton_means_from_cumulative_microsecond_counters(stand_in):
    s = one_interval("triton", stand_in(exposition.triton))
    size = hist(s, "triton_batch_size")
    assert size.count == 10 and size.mean() == pytest.approx(4.0)         # Δnv_inference_count / Δexec_count
    compute = hist(s, "triton_batch_compute_seconds")
    assert compute.count == 10 and compute.mean() == pytest.approx(0.008)
    assert math.isnan(compute.quantile(0.99))                             # a mean, no tail
    assert hist(s, "triton_queue_wait_mean_seconds").mean() == pytest.approx(0.0025)
    assert hist(s, "triton_request_duration_mean_seconds").mean() == pytest.approx(0.012)
    assert value(s.gauges, "triton_num_requests_waiting") == 6
    assert value(s.counters, "triton_errors_total") == 2 and value(s.counters, "triton_requests_total") == 40


def test_triton_batches_reach_the_batch_tuner_and_its_queue_mean_is_no_tail(stand_in):
    from slotune.config import ServiceConf
    from slotune.control.observations import Inputs
    from slotune.tuners import batch
    s = one_interval("triton", stand_in(exposition.triton))
    spec = ServiceSpec("svc", port=1, profile="triton")
    w = window.build(spec, 1.0, 2.0, [s])
    inputs = Inputs(2.0, [w], [w], ServiceConf(spec), {}, 1.0, lambda *_: None)
    assert batch.batches_run(inputs) == ((4, 10, pytest.approx(0.008)),)


def test_envoy_milliseconds_become_seconds(stand_in):
    s = one_interval("envoy", stand_in(exposition.envoy))
    rq = hist(s, "envoy_request_duration_seconds")
    assert rq.count == 20 and 0.025 < rq.quantile(0.99) <= 0.25 and rq.total_s == pytest.approx(0.6)
    assert value(s.counters, "envoy_errors_total") == 3                  # envoy_response_code_class="5" only
    assert value(s.gauges, "envoy_inflight_requests") == 7


def test_litellm_latency_and_ttft(stand_in):
    s = one_interval("litellm", stand_in(exposition.litellm))
    assert hist(s, "litellm_request_duration_seconds").count == 12
    assert hist(s, "litellm_time_to_first_token_seconds").quantile(0.99) <= 0.5
    assert value(s.counters, "litellm_errors_total") == 1 and value(s.counters, "litellm_requests_total") == 12


def test_llamacpp_slots_and_kv_from_its_metrics_page(stand_in):
    s = one_interval("llamacpp", stand_in(exposition.llamacpp))
    assert value(s.gauges, "llamacpp_num_requests_running") == 3        # requests_processing
    assert value(s.gauges, "llamacpp_num_requests_waiting") == 5        # requests_deferred
    assert value(s.gauges, "llamacpp_inflight_requests") == 8
    assert value(s.gauges, "llamacpp_kv_cache_usage_ratio") == pytest.approx(0.375)
    assert not s.histograms and not s.counters      # no latency, request or error count of its own
    assert not any(f.startswith("llamacpp:") for f, _ in s.gauges)


def test_llamacpp_is_recognised_by_its_page_and_its_processes():
    from slotune.commands import discover
    assert discover.recognise(exposition.llamacpp(1)).name == "llamacpp"
    for process, cmdline in (("llama-server", "/opt/llama.cpp/build/bin/llama-server -m /models/q4.gguf "
                                              "--port 8080 -np 4 --metrics"),
                             ("python3", "/usr/bin/python3 -m llama_cpp.server --model /models/q4.gguf --port 8000")):
        found = discover.by_process(discover.Listener(8080, 0, 1, process, cmdline))
        assert found is not None and found.name == "llamacpp", cmdline
    assert discover.by_process(discover.Listener(8080, 0, 1, "python3", "python3 -m http.server 8080")) is None


def test_the_reference_profile_keeps_its_families_names(stand_in):
    def text(n):
        return ("# TYPE inference_queue_wait_seconds histogram\n"
                f'inference_queue_wait_seconds_bucket{{le="0.01"}} {n}\n'
                f'inference_queue_wait_seconds_bucket{{le="+Inf"}} {n}\n'
                f"inference_queue_wait_seconds_sum {0.005 * n}\ninference_queue_wait_seconds_count {n}\n"
                "# TYPE inference_unread gauge\ninference_unread 1\n")

    s = one_interval("reference", stand_in(text))
    assert hist(s, "inference_queue_wait_seconds").count == 1 and not s.gauges


# --- the real servers --------------------------------------------------------------------
class Backend(http.server.ThreadingHTTPServer):
    """200 for every path but /fail, which answers 500."""

    def __init__(self):
        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def do_GET(h):
                code = 500 if h.path == "/fail" else 200
                h.send_response(code)
                h.send_header("Content-Length", "2")
                h.end_headers()
                h.wfile.write(b"ok")

            def log_message(h, *args):
                pass
        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()


def get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.fixture
def haproxy(tmp_path):
    """Real HAProxy in front of a Backend, its exporter on a frontend of its own."""
    if shutil.which("haproxy") is None:
        pytest.skip("haproxy is not installed (scripts/setup.sh installs it)")
    backend = Backend()
    try:
        with real_servers.haproxy(tmp_path / "haproxy", backend.server_address[1]) as h:
            yield h
    finally:
        backend.shutdown()
        backend.server_close()


def test_haproxy_real_exporter(haproxy):
    front = f"http://127.0.0.1:{haproxy.port}"

    def sent():
        return [get(f"{front}/ok") for _ in range(7)] + [get(f"{front}/fail") for _ in range(2)]

    s = one_interval("haproxy", haproxy.metrics_url, between=sent)
    assert value(s.counters, "haproxy_requests_total") == 9
    assert value(s.counters, "haproxy_errors_total") == 2              # code="5xx" only
    assert value(s.gauges, "haproxy_inflight_requests") == 0           # all answered before the scrape
    assert value(s.gauges, "haproxy_num_requests_waiting") == 0


@pytest.fixture
def nginx(tmp_path):
    """Real nginx, its stub_status on /nginx_status."""
    if shutil.which("nginx") is None:
        pytest.skip("nginx is not installed (scripts/setup.sh installs nginx-light)")
    with real_servers.nginx(tmp_path / "nginx", "", delay_s=0.01) as n:
        yield n


def test_nginx_real_stub_status(nginx):
    def sent():
        return [get(f"http://127.0.0.1:{nginx.port}/slow") for _ in range(5)]

    s = one_interval("nginx", f"http://127.0.0.1:{nginx.port}/nginx_status", between=sent)
    assert value(s.counters, "nginx_requests_total") == 6             # the 5, and the second scrape itself
    assert value(s.gauges, "nginx_inflight_requests") == 1            # the scrape, being written


def test_stub_status_that_is_not_one_costs_the_service_its_sample(stand_in):
    collector = ServiceMetricsCollector(timeout_s=3.0)
    try:
        collector.start([ServiceSpec("svc", port=1, metrics_url=stand_in(lambda n: "hello\n"), profile="nginx")])
        assert collector.collect(0.0, 1.0) == [] and collector.collect(1.0, 2.0) == []
        assert "does not parse" in collector.failing["svc"]
    finally:
        collector.close()


# --- config and the loop --------------------------------------------------------------
def load(tmp_path, text: str) -> config.Config:
    path = tmp_path / "slotune.toml"
    path.write_text(f'[daemon]\naudit_log = "{tmp_path}/audit.jsonl"\n' + text)
    return config.load(path)


def refused(tmp_path, text: str) -> config.ConfigError:
    with pytest.raises(config.ConfigError) as exc:
        load(tmp_path, text)
    return exc.value


def test_an_existing_config_keeps_the_reference_profile(tmp_path):
    cfg = load(tmp_path, '[services.api]\nport = 8000\nmetrics_url = "http://127.0.0.1:8000/metrics"\n'
                         'latency_metric = "api_request_duration_seconds"\n')
    assert cfg.service("api").spec.profile == "reference"
    assert cfg.service("api").spec.latency_metric == "api_request_duration_seconds"


def test_an_unknown_profile_is_refused_naming_the_known_ones(tmp_path):
    err = refused(tmp_path, '[services.api]\nport = 8000\nprofile = "vLLM"\n')
    assert err.key == "services.api.profile" and "vllm, sglang" in err.reason


def test_a_setting_the_profile_does_not_have_is_refused_with_the_fix(tmp_path):
    err = refused(tmp_path, '[services.llm]\nport = 8000\nprofile = "vllm"\n'
                            "[services.llm.settings.concurrency_limit]\nmin = 1\nmax = 64\nmax_step = 8\n")
    assert err.key == "services.llm.settings.concurrency_limit"
    assert "max_num_seqs" in err.reason and "admission_by" in err.reason
    err = refused(tmp_path, '[services.llm]\nport = 8000\nprofile = "tgi"\n'
                            "[services.llm.settings.max_batch_size]\nmin = 1\nmax = 64\nmax_step = 8\n")
    assert "read-only" in err.reason


def test_a_setting_pushed_by_another_actuator_is_refused(tmp_path):
    err = refused(tmp_path, '[services.lb]\nport = 8000\nprofile = "triton"\n'
                            '[services.lb.control]\nkind = "http-json"\nurl = "http://127.0.0.1:1/x"\n'
                            "[services.lb.settings.max_batch_size]\nmin = 1\nmax = 64\nmax_step = 8\n")
    assert err.key == "services.lb.control.kind" and 'kind = "triton"' in err.reason


def test_admission_by_must_name_a_proxy_that_can_take_the_limit(tmp_path):
    llm = ('[services.llm]\nport = 8000\nprofile = "vllm"\nadmission_by = "{}"\n'
           "[services.llm.tuners.throttle]\npolicy = \"slotune\"\n"
           "[services.llm.settings.concurrency_limit]\nmin = 1\nmax = 64\nmax_step = 8\n")
    err = refused(tmp_path, llm.format("front"))
    assert err.key == "services.llm.admission_by" and "not another declared service" in err.reason
    err = refused(tmp_path, llm.format("front") + '[services.front]\nport = 8080\nprofile = "haproxy"\n')
    assert "no [control] table" in err.reason
    err = refused(tmp_path, llm.format("front") + '[services.front]\nport = 8080\nprofile = "tgi"\n'
                  '[services.front.control]\nkind = "http-json"\nurl = "http://127.0.0.1:1/x"\n')
    assert err.key == "services.llm.settings.concurrency_limit" and "no live concurrency_limit" in err.reason


def window_at(t: float, service: str, slow_s: float) -> window.Window:
    """1000 requests in [t-1, t): 98 % at 20 ms, the slowest 2 % at slow_s."""
    values = np.r_[np.full(980, 20e6), np.full(20, slow_s * 1e9)]
    return window.Window(service, t - 1, t, 0.2, latency=Histogram.from_values(values), latency_source="ebpf")


def overloaded(service: str) -> Interval:
    """A calm second, then one whose P99 (2 s, against a 0.2 s SLO) is all queueing."""
    return Interval.at(2.0, {service: [window_at(1.0, service, 0.02), window_at(2.0, service, 2.0)]})


def test_a_restart_only_setting_is_recommended_never_pushed(tmp_path):
    cfg = load(tmp_path, '[services.llm]\nport = 11434\nprofile = "ollama"\nslo_p99_ms = 200.0\n'
                         '[services.llm.tuners.throttle]\npolicy = "slotune"\ninterval_s = 1.0\n'
                         "[services.llm.settings.concurrency_limit]\nmin = 1\nmax = 64\nmax_step = 8\n"
                         "integer = true\nin_force = 32\n")
    assert cfg.service("llm").recommend == {"concurrency_limit": "OLLAMA_NUM_PARALLEL"}
    audit = AuditLog(tmp_path / "audit.jsonl")
    loop = ControlLoop(cfg, {}, audit, dry_run=False)
    entries = loop.tick(overloaded("llm"))
    assert entries and {e.outcome for e in entries} == {Outcome.RECOMMENDED}
    assert "OLLAMA_NUM_PARALLEL" in entries[0].detail and "restart" in entries[0].detail
    line = json.loads((tmp_path / "audit.jsonl").read_text().splitlines()[0])
    assert line["outcome"] == "recommended" and line["setting"] == "concurrency_limit"
    later = Interval.at(4.0, {"llm": [window_at(t, "llm", s) for t, s in ((1.0, 0.02), (2.0, 2.0), (3.0, 2.0),
                                                                         (4.0, 2.0))]})
    assert loop.tick(later) == []          # the same recommendation again is not written again


def test_admission_by_pushes_the_throttle_through_the_proxy(tmp_path):
    settings = tmp_path / "proxy.json"
    settings.write_text(json.dumps({"concurrency_limit": 32}))
    cfg = load(tmp_path, '[services.llm]\nport = 8000\nprofile = "vllm"\nadmission_by = "front"\nslo_p99_ms = 200.0\n'
                         '[services.llm.tuners.throttle]\npolicy = "slotune"\ninterval_s = 1.0\n'
                         "[services.llm.settings.concurrency_limit]\nmin = 1\nmax = 64\nmax_step = 8\n"
                         'integer = true\n[services.front]\nport = 8080\n'
                         f'[services.front.control]\nkind = "file"\npath = "{settings}"\n')
    loop = ControlLoop(cfg, {"front": FileActuator(str(settings))}, AuditLog(tmp_path / "audit.jsonl"), False)
    entries = loop.tick(overloaded("llm"))
    assert [(e.service, e.setting, e.outcome) for e in entries] == [("llm", "concurrency_limit", Outcome.PUSHED)]
    assert json.loads(settings.read_text())["concurrency_limit"] == entries[0].new < 32


def test_admission_at_haproxy_needs_its_target_there(tmp_path):
    front = ('[services.front]\nport = 8080\nprofile = "haproxy"\n[services.front.control]\nkind = "haproxy"\n'
             'address = "/run/haproxy/admin.sock"\n[services.front.control.targets]\n{}\n')
    llm = ('[services.llm]\nport = 8000\nprofile = "vllm"\nadmission_by = "front"\n'
           '[services.llm.tuners.throttle]\npolicy = "slotune"\n'
           "[services.llm.settings.concurrency_limit]\nmin = 1\nmax = 64\nmax_step = 8\n")
    err = refused(tmp_path, llm + front.format('rate_limit_rps = "rate-limit sessions global"'))
    assert err.key == "services.front.control.targets.concurrency_limit" and "maxconn server" in err.reason
    cfg = load(tmp_path, llm + front.format('concurrency_limit = "maxconn server be_app/app"'))
    assert cfg.service("llm").admission_by == "front"


def test_the_throttle_of_an_engine_lands_on_the_real_haproxy_in_front(tmp_path, haproxy):
    """vLLM's observations, HAProxy's maxconn: read back from HAProxy's own `show stat`."""
    from slotune.actuators import for_control
    cfg = load(tmp_path, '[services.llm]\nport = 8000\nprofile = "vllm"\nadmission_by = "front"\nslo_p99_ms = 200.0\n'
                         '[services.llm.tuners.throttle]\npolicy = "slotune"\ninterval_s = 1.0\n'
                         "[services.llm.settings.concurrency_limit]\nmin = 1\nmax = 64\nmax_step = 8\ninteger = true\n"
                         f'[services.front]\nport = {haproxy.port}\nprofile = "haproxy"\n'
                         f'[services.front.control]\nkind = "haproxy"\naddress = "{haproxy.socket}"\n'
                         '[services.front.control.targets]\nconcurrency_limit = "maxconn server be_app/app"\n')
    actuators = {s.name: for_control(s.control) for s in cfg.services if s.control is not None}
    loop = ControlLoop(cfg, actuators, AuditLog(tmp_path / "audit.jsonl"), dry_run=False)
    entries = loop.tick(overloaded("llm"))
    assert [(e.service, e.old, e.new, e.outcome) for e in entries] == [("llm", 64.0, 56.0, Outcome.PUSHED)]
    assert haproxy.stat("be_app", "app")["slim"] == "56"


def test_every_profile_cites_its_page_and_is_in_the_targets_table():
    import importlib
    from slotune import profiles
    from tests.conftest import ROOT
    table = (ROOT / "docs/targets.md").read_text()
    for p in profiles.every():
        assert p.doc in importlib.import_module(f"slotune.profiles.{p.name}").__doc__, p.name
        assert f"| `{p.name}` |" in table, f"docs/targets.md has no row for the {p.name} profile"
        for s in p.settings or ():
            assert s.name in table, f"docs/targets.md: {p.name}'s {s.name}"


def test_every_live_setting_names_an_actuator_that_takes_its_target():
    """The profiles' declarations and the actuators' forms agree (placeholders filled as a user would)."""
    from slotune import profiles
    filled = {"BACKEND/SERVER": "be_app/app", "ZONE": "perserver", "CLUSTER": "vllm"}
    for p in profiles.every():
        for s in p.settings or ():
            if not s.live:
                assert s.kind == "", (p.name, s.name)
                continue
            assert s.kind in ACTUATORS, (p.name, s.name, s.kind)
            target = s.target
            for placeholder, name in filled.items():
                target = target.replace(placeholder, name)
            why = ACTUATORS[s.kind].target_error(target) if ACTUATORS[s.kind].TARGETS else "takes no targets"
            assert why is None, (p.name, s.name, why)
