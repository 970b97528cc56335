#!/usr/bin/env bash
# --workers N --engine against one process and today's --workers N (N whole servers), side by
# side, alternating: throughput, latency and the mean batch size at CONNS connections.
#   usage: benchmarks/peers/engine_compare.sh [SECONDS] [ROUNDS] [CONNS] [SERVERS...]
#   (default: 6 2 64 inferd inferd-w2 inferd-e2; SERVERS as compare.sh, plus inferd-eN)
# The mean batch size is the statistics API's inference_count / execution_count over the run
# (with --workers N the worker that answers sums its siblings; with --engine it is the one
# engine's own count).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
SECS="${1:-6}"; ROUNDS="${2:-2}"; CONNS="${3:-64}"; shift 3 || true
SERVERS=("${@:-inferd inferd-w2 inferd-e2}"); SERVERS=(${SERVERS[@]})
PORT=18900
"$ROOT/.venv/bin/python" "$HERE/inferd_repo.py" "$HERE/results/inferd_repo" >/dev/null
# shellcheck source=servers.sh
source "$HERE/servers.sh"
counts() {  # $1 model -> "inference_count execution_count" ("0 0" for a peer without them)
  curl -s "http://127.0.0.1:$PORT/v2/models/$1/stats" | python3 -c '
import json, sys
try:
    s = json.load(sys.stdin)["model_stats"][0]
    print(s["inference_count"], s["execution_count"])
except Exception:
    print(0, 0)'
}
for round in $(seq "$ROUNDS"); do
  for model in tiny mlp; do
    for server in "${SERVERS[@]}"; do
      pid=$(start_server "$server" "$model")
      read -r n0 e0 <<<"$(counts "$model")"
      out=$(wrk -t1 -c"$CONNS" -d"${SECS}s" --latency -s "$HERE/v2_infer.lua" \
        "http://127.0.0.1:$PORT/v2/models/$model/infer")
      read -r n1 e1 <<<"$(counts "$model")"
      stop_server "$server" "$pid"
      printf 'round %s %-5s c=%s %-10s %9s req/s  p50 %-8s p99 %-8s mean batch %s  errors %s\n' \
        "$round" "$model" "$CONNS" "$server" "$(awk '/Requests\/sec/ {print $2}' <<<"$out")" \
        "$(awk '$1=="50%" {print $2}' <<<"$out")" "$(awk '$1=="99%" {print $2}' <<<"$out")" \
        "$(python3 -c "print(f'{($n1-$n0)/($e1-$e0):.2f}' if $e1 > $e0 else '-')")" \
        "$(awk '/Non-2xx/ {print $NF}' <<<"$out" | grep . || echo 0)"
    done
  done
done
