# Every target sets up what it needs first (scripts/setup.sh is idempotent).
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: setup engine test demo demo-engine bench doctor
setup:
	bash scripts/setup.sh

# vLLM's CPU build and a tiny model, for the tests and demo that run a real engine.
engine: setup
	bash scripts/engine.sh

test: setup engine
	$(PY) -m pytest -ra --durations=15

# The agent stack under a load step, then the inference server in LLM mode under a
# streaming one (continuous batching, TTFT/TPOT SLOs): about 3 + 3 minutes.
demo: setup
	$(VENV)/bin/slotune demo
	$(VENV)/bin/slotune demo --llm

# A real vLLM (CPU build, tiny model) behind HAProxy, throttled by slotune through a
# step to twice its capacity and back: about 3 minutes after the engine's set-up.
demo-engine: setup engine
	$(VENV)/bin/slotune demo --engine vllm

bench: setup
	$(PY) -m bench

doctor: setup
	$(VENV)/bin/slotune doctor
