#!/usr/bin/env bash
# Create one venv per peer server and install pinned versions into it.
#   usage: benchmarks/peers/setup.sh [triton|mlserver|mosec|litserve|all]   (default: all)
# Idempotent: a venv whose pinned packages are already installed is left alone
# (a stamp file records the pin list and constraints file it was built from).
# To refresh the full pins after changing PINS: delete constraints/PEER.txt's lines you
# want re-resolved, rerun, then `.venv-PEER/bin/pip freeze > constraints/PEER.txt`.
# Also builds the example MLP (examples/build_models.py's mlp(), seed 0) into benchmarks/peers/results/models.
# Set PYTHON to choose the base interpreter (default: python3).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$HERE/../.." && pwd)"
PYTHON="${PYTHON:-python3}"

# Pinned versions (latest on PyPI when this was written).
ORT="onnxruntime==1.32.0"          # same as inferd's venv
# The minilm service (text -> embedding) tokenises with `tokenizers` over the example's own
# tokenizer.json: the version inferd's venv has (Triton runs only tiny and mlp).
TOK="tokenizers==0.23.3"
declare -A PINS=(
  [triton]="nvidia-pytriton==0.7.0 $ORT"
  # MLServer 1.7.1's worker process dies at start with uvloop >= 0.22; there is no
  # mlserver-onnx package on PyPI, so the ONNX model uses a custom runtime (mlserver/runtimes.py).
  [mlserver]="mlserver==1.7.1 uvloop<0.22 $ORT $TOK"
  [mosec]="mosec==0.9.8 $ORT $TOK"
  # LitServe pulls in no torch (numpy models are fine); pyzmq comes with it (fast_queue).
  [litserve]="litserve==0.2.19 $ORT $TOK"
)

setup_one() {
  local peer="$1" venv="$HERE/.venv-$1" pins="${PINS[$1]}"
  # constraints/PEER.txt pins every transitive dependency too (pip freeze of a working venv).
  local cons="$HERE/constraints/$peer.txt"
  local stamp="$venv/.pins" want
  want="$pins $(sha256sum "$cons" | cut -c1-16)"
  if [[ -x "$venv/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    echo "== $peer: up to date ($venv)"
  else
    echo "== $peer: installing $pins"
    local t0=$SECONDS
    [[ -x "$venv/bin/python" ]] || "$PYTHON" -m venv "$venv"
    # shellcheck disable=SC2086
    # (the grep drops pip's warnings about this machine's unused local index paths)
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -c "$cons" $pins \
      2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
    echo "$want" > "$stamp"
    echo "== $peer: installed in $((SECONDS - t0)) s"
  fi
  echo "   venv size: $(du -sh "$venv" | cut -f1)"
  "$venv/bin/python" -m pip list --disable-pip-version-check 2>/dev/null \
    | grep -Ei '^(nvidia-pytriton|tritonclient|mlserver|mosec|litserve|onnxruntime|numpy|uvloop|msgspec|fastapi|uvicorn|pyzmq|tokenizers) ' \
    | sed 's/^/   /'
}

build_models() {
  local models="$HERE/results/models"
  if [[ ! -f "$models/mlp/1/model.onnx" ]]; then
    if [[ ! -x "$REPO_ROOT/.venv/bin/python" ]]; then
      echo "inferd's venv ($REPO_ROOT/.venv) is missing: it builds the MLP (needs onnx)" >&2; exit 1
    fi
    mkdir -p "$models"
    # Only the ONNX MLP (build() would also want torch for mlp_torch).
    "$REPO_ROOT/.venv/bin/python" - "$REPO_ROOT/examples" "$models" <<'PY'
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import build_models as b
b._save(b.mlp([64, 1024, 1024, 16], seed=0), Path(sys.argv[2]) / "mlp" / "1" / "model.onnx")
PY
  fi
  echo "== mlp model: $models/mlp/1/model.onnx"
}

target="${1:-all}"
case "$target" in
  triton|mlserver|mosec|litserve) setup_one "$target" ;;
  all) for p in triton mlserver mosec litserve; do setup_one "$p"; done ;;
  *) echo "usage: $0 [triton|mlserver|mosec|litserve|all]" >&2; exit 2 ;;
esac
build_models
