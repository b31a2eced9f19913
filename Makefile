# Every target sets up what it needs first (scripts/setup.sh is idempotent).
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: setup test demo bench doctor
setup:
	bash scripts/setup.sh

test: setup
	$(PY) -m pytest -ra

demo: setup
	$(VENV)/bin/slotune demo

bench: setup
	$(PY) -m bench

doctor: setup
	$(VENV)/bin/slotune doctor
