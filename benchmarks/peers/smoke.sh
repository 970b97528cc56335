#!/usr/bin/env bash
# Smoke check of every peer and model: start it, verify one known input against the expected
# output, run a short wrk load, stop it. A smoke test, NOT the comparison (short, one run,
# on a shared 2-core machine).
#   usage: benchmarks/peers/smoke.sh [SECONDS (5)] [CONNECTIONS (8)] [PEER...]
# Writes results/smoke-PEER-MODEL[-native].txt (verify + wrk output) and prints a summary.
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DUR="${1:-5}" CONNS="${2:-8}"; shift $(( $# > 2 ? 2 : $# ))
PEERS=("$@"); [[ ${#PEERS[@]} -gt 0 ]] || PEERS=(triton mlserver mosec litserve)
VERIFY_PY="${VERIFY_PY:-$HERE/../../.venv/bin/python}"   # inferd's venv: numpy + onnxruntime
declare -A PORT=([triton]=8100 [mlserver]=8200 [mosec]=8300 [litserve]=8400)
mkdir -p "$HERE/results"
summary=()

one() {  # PEER MODEL API
  local peer="$1" model="$2" api="$3" port="${PORT[$1]}" out pid lua url extra=() rps ok
  out="$HERE/results/smoke-$peer-$model$([[ $api == native ]] && echo -native).txt"
  if [[ $api == native ]]; then
    extra=(--api native); lua="$HERE/mosec_infer.lua"; url="http://127.0.0.1:$port/inference"
  else
    lua="$HERE/v2_infer.lua"; url="http://127.0.0.1:$port/v2/models/$model/infer"
  fi
  if ! pid="$("$HERE/run_peer.sh" "$peer" "$model" "$port" "${extra[@]}")"; then
    summary+=("$peer $model $api: FAILED TO START"); return
  fi
  {
    echo "# $peer $model ($api)  $(date -Is)  load: $(cut -d' ' -f1-3 /proc/loadavg)"
    "$VERIFY_PY" "$HERE/verify.py" --model "$model" --url "http://127.0.0.1:$port" --api "$api"
    echo "verify rc=$?"
    echo "\$ wrk -t2 -c$CONNS -d${DUR}s -s $lua $url"
    wrk -t2 -c"$CONNS" -d"${DUR}s" -s "$lua" "$url"
  } > "$out" 2>&1
  "$HERE/stop_peer.sh" "$pid" >/dev/null
  rps="$(awk '/^Requests\/sec/ {print $2}' "$out")"
  ok="$(grep -q 'verify rc=0' "$out" && echo verified || echo WRONG-OUTPUT)"
  grep -q 'Non-2xx' "$out" && ok="$ok, NON-2xx REPLIES"
  summary+=("$(printf '%-9s %-5s %-7s %-10s %s req/s' "$peer" "$model" "$api" "$ok" "${rps:-?}")")
}

for peer in "${PEERS[@]}"; do
  for model in tiny mlp; do
    one "$peer" "$model" v2
    [[ $peer == mosec ]] && one "$peer" "$model" native
  done
done
echo "smoke (not the comparison): wrk -t2 -c$CONNS -d${DUR}s, one run each"
printf '%s\n' "${summary[@]}"
