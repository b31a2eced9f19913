"""Live: the real inference server in LLM mode (paced: PACED below), read each second by the daemon's
own service-metrics collector into windows; after a calm baseline a burst of
streaming requests overfills its running batch, and the TTFT explanation must
name queueing (the waiting sequences) as its top cause."""
import threading
import time

from slotune.attribution.explain import explain
from slotune.collectors.service_metrics import ServiceMetricsCollector
from slotune.model import window
from slotune.model.service import ServiceSpec
from reference_stack import launcher
from reference_stack.llm.load import Lengths, run_llm_load
from tests.stack.conftest import one_service

CALM_S = 16          # at least 5 spans of 2 s with first tokens, before the recent 2 s
BURST_S = 4          # judged after 3 s of it: its recent span lies inside the burst
MAX_NUM_SEQS = 1     # a batch of one, so that a burst waits for places
# Paced capacity (reference_stack/paced.py): each engine step 1 ms + 0.25 ms a sequence, so at a
# batch of one a 48-token answer takes 60 ms on any host (16.7 answers/s): the calm 2 requests/s
# keep an eighth of it busy, and the burst's 20/s add 3 to the waiting line each second.
PACED = ["--paced", "1,0.25,0.05"]
BURST_RPS = 20.0


def test_a_burst_past_the_running_batch_is_explained_by_waiting_sequences(tmp_path):
    files = launcher.init_run_dir(tmp_path)
    port = launcher.free_ports(1)[0]
    url = f"http://127.0.0.1:{port}"
    args = ["inference", "--port", str(port), "--run-dir", str(tmp_path), *launcher.SMALL_LLM_MODEL, *PACED,
            "--token-file", str(files["token_file"]), "--set", f"max_num_seqs={MAX_NUM_SEQS}"]
    spec = ServiceSpec("inference", metrics_url=url + "/metrics",
                       latency_metric="inference_e2e_request_latency_seconds", slo_p99_s=30.0,
                       slo_ttft_p99_s=0.5, slo_tpot_p99_s=0.05, ttft_metric="inference_time_to_first_token_seconds",
                       tpot_metric="inference_inter_token_latency_seconds")
    prompt, output = Lengths(24, 0, 128, "fixed"), Lengths(48, 0, 256, "fixed")
    collector = ServiceMetricsCollector()
    collector.start([spec])
    history = []
    with one_service(args, url + "/healthz"):
        def load():
            run_llm_load(url + "/v1/completions", 2.0, CALM_S, prompt, output, timeout_s=30, seed=1)
            time.sleep(max(began + CALM_S - time.time(), 0))    # the calm load ends with its last answer
            run_llm_load(url + "/v1/completions", BURST_RPS, BURST_S, prompt, output, timeout_s=30, seed=2)
        loader = threading.Thread(target=load, daemon=True)
        collector.collect(0.0, time.time())                     # the starting point of every delta
        began = start = time.time()
        loader.start()
        while time.time() - began < CALM_S + 3:
            time.sleep(max(start + 1.0 - time.time(), 0))
            end = time.time()
            history.append(window.build(spec, start, end, collector.collect(start, end)))
            start = end
        ttft = explain("inference", {"inference": history}, now=end).tokens["ttft"]
    loader.join(timeout=40)
    collector.close()
    print(ttft.verdict)
    assert ttft.top_cause == "queue", (ttft.verdict, ttft.evidence)
    queue = ttft.evidence["queue"]
    assert queue.recent > queue.baseline + MAX_NUM_SEQS, queue     # the waiting line grew
    assert ttft.growth_s > 0 and "queue (waiting" in ttft.verdict
