"""Ollama: no metrics endpoint, so slotune sees it through eBPF only (request
latency on its port 11434, run-queue, off-CPU, TCP). Its parallelism and queue are
environment variables read at start (OLLAMA_NUM_PARALLEL, OLLAMA_MAX_QUEUE; "FAQ: How
does Ollama handle concurrent requests?", https://github.com/ollama/ollama/blob/main/docs/faq.md),
so slotune recommends them."""
from slotune.profiles import Profile, Setting

PROFILE = Profile(
    name="ollama",
    doc="https://github.com/ollama/ollama/blob/main/docs/faq.md",
    settings=(
        Setting("concurrency_limit", "", "OLLAMA_NUM_PARALLEL", live=False),
        Setting("max_queue", "", "OLLAMA_MAX_QUEUE", live=False),
    ),
    exposition="",
    metrics_path="",
    processes=("ollama",),
)
