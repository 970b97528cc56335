#!/usr/bin/env bash
# What batching costs a lone request: inferd's MLP with batching on (max 32, 2 ms bound,
# the default work-conserving policy) against the same model with batching off, one
# connection, alternating ROUNDS times.   usage: benchmarks/peers/lone_request.sh [SECONDS] [ROUNDS]
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
SECS="${1:-8}"; ROUNDS="${2:-3}"
PORT=18900
"$ROOT/.venv/bin/python" "$HERE/inferd_repo.py" "$HERE/results/inferd_repo" >/dev/null
# shellcheck source=servers.sh
source "$HERE/servers.sh"
pid=$(start_server inferd mlp)
for round in $(seq "$ROUNDS"); do
  for model in mlp mlp_nobatch; do
    out=$(V2_INPUT=input wrk -t1 -c1 -d"${SECS}s" --latency -s "$HERE/v2_infer.lua" \
      "http://127.0.0.1:$PORT/v2/models/$model/infer")
    printf 'round %s %-12s %9s req/s  p50 %-8s p99 %s\n' "$round" "$model" \
      "$(awk '/Requests\/sec/ {print $2}' <<<"$out")" \
      "$(awk '$1=="50%" {print $2}' <<<"$out")" "$(awk '$1=="99%" {print $2}' <<<"$out")"
  done
done
stop_server inferd "$pid"
