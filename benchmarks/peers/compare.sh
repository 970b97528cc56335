#!/usr/bin/env bash
# Side by side over HTTP: inferd and the peers, the same two models, one load generator (wrk),
# concurrency 1, 8 and 64, servers alternating within each (model, concurrency) cell.
#   usage: benchmarks/peers/compare.sh [SECONDS] [SERVERS...]   (default: 8 inferd triton mlserver mosec)
#   (SERVERS also: inferd-wN and mosec-wN for N worker processes, litserve)
# Prints one line per run and writes results/compare.csv. Needs setup.sh and, for inferd,
# the repo's .venv (make test or make serve) and inferd_repo.py's repository.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
SECONDS_PER_RUN="${1:-8}"; shift || true
SERVERS=("${@:-inferd triton mlserver mosec}"); SERVERS=(${SERVERS[@]})
PORT=18900
mkdir -p "$HERE/results"
"$ROOT/.venv/bin/python" "$HERE/inferd_repo.py" "$HERE/results/inferd_repo" >/dev/null
CSV="$HERE/results/compare.csv"
echo "model,concurrency,server,requests_per_s,latency_p50_ms,latency_p99_ms,errors" > "$CSV"

# shellcheck source=servers.sh
source "$HERE/servers.sh"

for model in tiny mlp; do
  for c in 1 8 64; do
    for server in "${SERVERS[@]}"; do
      pid=$(start_server "$server" "$model")
      out=$(wrk -t1 -c"$c" -d"${SECONDS_PER_RUN}s" --latency -s "$HERE/v2_infer.lua" \
        "http://127.0.0.1:$PORT/v2/models/$model/infer")
      stop_server "$server" "$pid"
      rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
      p50=$(awk '$1=="50%" {print $2}' <<<"$out")
      p99=$(awk '$1=="99%" {print $2}' <<<"$out")
      errors=$(awk '/Non-2xx/ {print $NF}' <<<"$out"); errors=${errors:-0}
      printf '%-5s c=%-3s %-9s %9s req/s  p50 %-8s p99 %-8s errors %s\n' \
        "$model" "$c" "$server" "$rps" "$p50" "$p99" "$errors"
      echo "$model,$c,$server,$rps,$p50,$p99,$errors" >> "$CSV"
    done
  done
done
