#!/usr/bin/env bash
# Make a Debian/Ubuntu host ready for slotune: distro packages (BCC, headers,
# bpftool, Prometheus, Redis, iproute2), kernel-header links, tracefs, and the
# project's virtual environment. Idempotent: every step checks before it acts,
# and says what it does. Run as root (or through sudo); CI=true never prompts.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV="$ROOT/.venv"
KREL=$(uname -r)
STAMP="$VENV/.slotune-installed"
export DEBIAN_FRONTEND=noninteractive

step() { printf '==> %s\n' "$*"; }
ok()   { printf '    ok: %s\n' "$*"; }
warn() { printf '    note: %s\n' "$*"; }
die()  { printf 'setup: %s\n' "$*" >&2; exit 1; }

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || die "run as root, or install sudo: slotune needs root for packages, tracefs and BPF"
  SUDO="sudo"
  [ "${CI:-}" = "true" ] && SUDO="sudo -n"
fi

# --- distro packages -------------------------------------------------------
PACKAGES=(python3-bpfcc bpfcc-tools bpftool prometheus redis-server iproute2 iperf3
          python3-venv python3-dev gcc make openssl procps systemd strace golang nginx-light
          libnginx-mod-http-echo haproxy prometheus-alertmanager wrk bpftrace)

step "distro packages"
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
headers_pkg="linux-headers-$KREL"
if [ ! -e "/lib/modules/$KREL/build" ]; then
  if apt-cache show "$headers_pkg" >/dev/null 2>&1; then
    missing+=("$headers_pkg")
  else
    for fallback in linux-headers-cloud-amd64 linux-headers-amd64 linux-headers-generic; do
      if apt-cache show "$fallback" >/dev/null 2>&1; then headers_pkg=$fallback; break; fi
    done
    dpkg-query -W -f='${Status}' "$headers_pkg" 2>/dev/null | grep -q 'install ok installed' \
      || missing+=("$headers_pkg")
  fi
fi
if [ ${#missing[@]} -gt 0 ]; then
  step "apt-get install ${missing[*]}"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  ok "installed ${#missing[@]} package(s)"
else
  ok "all present"
fi

# --- kernel headers ---------------------------------------------------------
step "kernel headers for $KREL"
if [ -e "/lib/modules/$KREL/build/include" ]; then
  ok "/lib/modules/$KREL/build exists"
else
  arch_dir=$(ls -d /usr/src/linux-headers-*-cloud-amd64 /usr/src/linux-headers-*-amd64 \
                    /usr/src/linux-headers-*-generic 2>/dev/null | sort -V | tail -n 1 || true)
  [ -n "$arch_dir" ] || die "no kernel headers found under /usr/src; install linux-headers for your kernel"
  common_dir=$(echo "$arch_dir" | sed -E 's/-(cloud-amd64|amd64|generic)$/-common/')
  [ -d "$common_dir" ] || common_dir=$arch_dir
  $SUDO mkdir -p "/lib/modules/$KREL"
  $SUDO ln -sfn "$arch_dir" "/lib/modules/$KREL/build"
  $SUDO ln -sfn "$common_dir" "/lib/modules/$KREL/source"
  warn "no headers for $KREL in the distro: linked build -> $arch_dir, source -> $common_dir"
  warn "their struct layouts differ from the running kernel; slotune reads only tracepoint fields and BTF offsets, so this is safe"
fi

# --- tracefs ----------------------------------------------------------------
step "tracefs"
if [ -e /sys/kernel/tracing/events ]; then
  ok "mounted at /sys/kernel/tracing"
else
  $SUDO mount -t tracefs nodev /sys/kernel/tracing && ok "mounted tracefs at /sys/kernel/tracing" \
    || warn "could not mount tracefs; BPF probes will be unavailable (slotune doctor tells more)"
fi

# --- virtual environment ----------------------------------------------------
step "virtual environment $VENV"
PY=${PYTHON:-python3}
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
  || die "$PY is older than 3.11; install Python 3.11+ or set PYTHON=/path/to/python3.11"
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
  ok "created"
else
  ok "exists"
fi
site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if [ ! -e "$site/bcc" ]; then
  bcc_dir=$(ls -d /usr/lib/python3/dist-packages/bcc 2>/dev/null || true)
  [ -n "$bcc_dir" ] || die "python3-bpfcc installed no bcc module under /usr/lib/python3/dist-packages"
  ln -sfn "$bcc_dir" "$site/bcc"
  ok "linked the distro's bcc module into the venv"
fi
# The daemon plus its extras: [stack] (the reference stack: aiohttp, redis, torch)
# and [report] (matplotlib) for `make demo`, [test] for `make test`. A host that
# only runs the daemon needs no extras: `pip install .`.
# Reinstall only when the dependency list or the package layout changed. The editable
# install maps the slotune package onto daemon/, tuners/ and bpf/ (setup.py), so
# modules and folders added under them import without a reinstall.
want=$(cat "$ROOT/pyproject.toml" "$ROOT/setup.py" | sha256sum | cut -d' ' -f1)
if [ "$(cat "$STAMP" 2>/dev/null)" != "$want" ]; then
  step "pip install -e .[test,stack,report,otlp]"
  log="$VENV/pip-install.log"
  if ! { "$VENV/bin/python" -m pip install --upgrade pip \
         && "$VENV/bin/python" -m pip install -e "$ROOT[test,stack,report,otlp]"; } >"$log" 2>&1; then
    tail -n 30 "$log" >&2
    die "pip install failed; the whole log is in $log"
  fi
  echo "$want" > "$STAMP"
  ok "installed"
else
  ok "project and dependencies up to date"
fi
"$VENV/bin/python" -c 'import bcc' || die "the venv cannot import bcc"
ok "venv imports bcc"
step "ready: $VENV/bin/slotune doctor checks the host in detail"
