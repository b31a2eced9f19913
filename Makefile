# Every target sets up what it needs first (scripts/setup.sh is idempotent).
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: setup engine test demo bench doctor
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

bench: setup
	$(PY) -m bench

doctor: setup
	$(VENV)/bin/slotune doctor
