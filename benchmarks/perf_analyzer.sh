#!/usr/bin/env bash
# Run Triton's perf_analyzer against inferd, setting it up on first use.
#   usage: benchmarks/perf_analyzer.sh -m mlp -u 127.0.0.1:8000 -i http --concurrency-range 1
#          benchmarks/perf_analyzer.sh --install   # only set it up (`make test-tools` does)
#
# Why it's done this way:
# - PyPI's `perf-analyzer` wheel needs a newer glibc than Debian 12 (2.36) has,
#   but the perf_analyzer binary inside the tritonclient==2.50.0 wheel runs here.
# - It gets its own venv, so the project can still use a newer tritonclient.
# - The binary is dynamically linked against libb64 (Debian: libb64-0d) and
#   libcudart.so.12, even for HTTP/gRPC-only use with no GPU. libcudart comes from
#   PyPI's nvidia-cuda-runtime-cu12, which is not on the loader path by default.
# Set PYTHON to choose the interpreter used to create the venv (default: python3).
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$REPO_ROOT/benchmarks/.venv-perf-analyzer"
PY="$VENV/bin/python"

if [[ ! -x "$PY" ]]; then
  "${PYTHON:-python3}" -m venv "$VENV"
fi

# Get the directory holding libcudart.so.12 (nvidia/cuda_runtime/lib under the venv's site-packages).
cudart_dir() {
  "$PY" -c 'import os, sysconfig; print(os.path.join(sysconfig.get_paths()["purelib"], "nvidia", "cuda_runtime", "lib"))'
}

# Install only if something is missing, so later runs start straight away.
if [[ ! -x "$VENV/bin/perf_analyzer" || ! -e "$(cudart_dir)/libcudart.so.12" ]]; then
  "$PY" -m pip install --quiet --disable-pip-version-check \
    'tritonclient[all]==2.50.0' 'nvidia-cuda-runtime-cu12'
fi

# libb64 is a system library, so it comes from apt rather than pip.
# (grep without -q reads all its input, so pipefail can't trip on SIGPIPE from ldconfig.)
if ! ldconfig -p | grep 'libb64\.so\.0d' >/dev/null && ! dpkg -s libb64-0d >/dev/null 2>&1; then
  SUDO=""; [[ $EUID -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update
  $SUDO apt-get install -y --no-install-recommends libb64-0d
fi

if [[ "${1:-}" == "--install" ]]; then
  exit 0
fi

export LD_LIBRARY_PATH="$(cudart_dir)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
exec "$VENV/bin/perf_analyzer" "$@"
