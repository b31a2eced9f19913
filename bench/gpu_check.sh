#!/usr/bin/env bash
# The GPU host check, in one go (under 5 minutes): sets up what is missing, runs
# the reference stack's inference server on CUDA under load with slotune's NVML
# collector attached, and prints the service's GPU metrics, one sweep's cost,
# what a second process saturating the GPU changes (and the attribution), and
# the batch-size vs throughput curve. Exits 3 at once on a host without a GPU.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY="$ROOT/.venv/bin/python"

usage() {
  cat <<'EOF'
usage: bash bench/gpu_check.sh [--seconds N] [--clients N] [--server-cmd CMD] [--skip-setup]

  --seconds N       length of each watch phase (alone, then saturated), default 15
  --clients N       concurrent load clients against the inference server, default 32
  --server-cmd CMD  how to start the inference server; {python}, {port}, {run_dir}, {device} are filled in
  --skip-setup      do not run scripts/setup.sh even if the venv is missing

examples:
  bash bench/gpu_check.sh
  bash bench/gpu_check.sh --seconds 10 --clients 64
EOF
}

args=()
skip_setup=0
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --skip-setup) skip_setup=1; shift ;;
    --seconds|--clients|--server-cmd)
      [ $# -ge 2 ] || { echo "gpu_check: $1 needs a value (see --help)" >&2; exit 2; }
      args+=("$1" "$2"); shift 2 ;;
    *) echo "gpu_check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

# No NVML library, no GPU: say so before installing or starting anything.
if ! python3 -c 'import ctypes; ctypes.CDLL("libnvidia-ml.so.1")' 2>/dev/null; then
  echo "gpu_check: no NVIDIA GPU on this host (libnvidia-ml.so.1 not found): run it on a GPU host; nothing was started" >&2
  exit 3
fi

if [ ! -x "$PY" ]; then
  [ "$skip_setup" = 1 ] && { echo "gpu_check: $PY missing and --skip-setup given: run bash scripts/setup.sh" >&2; exit 2; }
  bash "$ROOT/scripts/setup.sh"
fi
if ! "$PY" -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
  echo "gpu_check: torch in $ROOT/.venv has no CUDA (a CPU build?): install the CUDA build, e.g." >&2
  echo "  $PY -m pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128" >&2
  exit 3
fi
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv 2>/dev/null || true
cd "$ROOT"
exec "$PY" -m bench.gpu_check run "${args[@]}"
