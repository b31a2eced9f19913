"""Paced capacity (inference --paced): a batch takes its longest answer's tokens x
(step + per-sequence x its size) of a clock, whatever the host is doing, so a
test's "twice capacity" is twice a known figure."""
from __future__ import annotations

import pytest

from reference_stack import launcher
from reference_stack.client import StackClient
from reference_stack.llm.load import Lengths, run_llm_load
from reference_stack.paced import Pace
from tests.stack.conftest import one_service


def test_the_pace_is_read_and_its_capacity_is_the_formula():
    pace = Pace.parse("5,0.5,0.05")
    assert (pace.step_ms, pace.per_seq_ms, pace.jitter) == (5.0, 0.5, 0.05)
    assert pace.batch_s(8, 12) == pytest.approx(0.108)
    assert pace.capacity(1, 12) == pytest.approx(1 / 0.066)
    for bad in ("5", "a,b", "5,0.5,0.9", "-1,2", "1,2,3,4", "nan,1"):
        with pytest.raises(ValueError, match="STEP_MS,PER_SEQ_MS"):
            Pace.parse(bad)


def test_a_paced_server_batches_and_takes_at_least_its_paced_time(tmp_path):
    port = launcher.free_ports(1)[0]
    url = f"http://127.0.0.1:{port}"
    args = ["inference", "--port", str(port), "--run-dir", str(tmp_path), "--paced", "20,2",
            "--set", "max_batch_size=4", "--set", "max_queue_delay_ms=500"]
    token = tmp_path / "admin.token"
    token.write_text("paced-test\n")
    token.chmod(0o600)
    with one_service(args, url + "/healthz"):
        client = StackClient({"urls": {"inference": url}, "run_dir": str(tmp_path), "token_file": str(token)})

        def ask(i):
            return client.http("POST", url + "/generate", {"prompt": f"q{i}", "max_new_tokens": 12})
        answers = StackClient.concurrently(ask, list(range(8)))
        assert all(status == 200 for status, _ in answers), answers
        bodies = [body for _, body in answers]
        assert {b["tokens"] for b in bodies} == {12} and {b["device"] for b in bodies} == {"paced"}
        assert max(b["batch_size"] for b in bodies) == 4
        batches = client.metric("inference", "inference_batch_compute_seconds_count")
        slept = client.metric("inference", "inference_batch_compute_seconds_sum")
    # Batches of sizes s_i (summing to 8) sleep 12 x (20 + 2 x s_i) ms each, no jitter: together
    # 12 x (20 x batches + 16) ms, and a sleep is never shorter.
    assert batches >= 2 and slept >= 0.999 * 12 * (20 * batches + 2 * 8) / 1e3, (batches, slept)


def test_a_paced_llm_server_streams_at_its_paced_step(tmp_path):
    """--mode llm --paced: each engine step sleeps step + per-sequence x its sequences, so one
    streamed answer of 32 tokens at a batch of one takes at least 32 steps of 12 ms (never
    shorter: the host's delays only add)."""
    files = launcher.init_run_dir(tmp_path)
    port = launcher.free_ports(1)[0]
    url = f"http://127.0.0.1:{port}"
    args = ["inference", "--port", str(port), "--run-dir", str(tmp_path), *launcher.SMALL_LLM_MODEL,
            "--token-file", str(files["token_file"]), "--paced", "10,2", "--set", "max_num_seqs=1"]
    with one_service(args, url + "/healthz"):
        records = run_llm_load(url + "/v1/completions", 5.0, 1.0, Lengths(16, 0, 64, "fixed"),
                               Lengths(32, 0, 64, "fixed"), timeout_s=30, seed=1)
    assert records and all(r.ok for r in records), records
    record = records[0]          # the first runs alone: the batch holds one
    # after the first token, 31 more steps; the client may read two events at once, so a single
    # gap can be short, their sum never
    assert record.e2e_s - record.ttft_s >= 31 * 0.012 * 0.999 and record.e2e_s >= 32 * 0.012 * 0.999, record
