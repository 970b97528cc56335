#!/usr/bin/env bash
# Side by side over gRPC: inferd, Triton (PyTriton) and MLServer (Mosec has no gRPC), the
# same two models, one load generator (inferd bench -i grpc), concurrency 1, 8 and 64,
# servers alternating within each (model, concurrency) cell.
#   usage: benchmarks/peers/compare_grpc.sh [SECONDS] [SERVERS...]  (default: 8 inferd triton mlserver)
# Prints one line per run; each run's full report is in results/grpc-SERVER-MODEL-cN.json.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
SECONDS_PER_RUN="${1:-8}"; shift || true
SERVERS=("${@:-inferd triton mlserver}"); SERVERS=(${SERVERS[@]})
PORT=18950
mkdir -p "$HERE/results"
"$ROOT/.venv/bin/python" "$HERE/inferd_repo.py" "$HERE/results/inferd_repo" >/dev/null

# shellcheck source=servers.sh
source "$HERE/servers.sh"

for model in tiny mlp; do
  for c in 1 8 64; do
    processes=1; [[ "$c" -ge 64 ]] && processes=2
    for server in "${SERVERS[@]}"; do
      pid=$(start_server "$server" "$model")
      json="$HERE/results/grpc-$server-$model-c$c.json"
      "$ROOT/.venv/bin/inferd" bench -m "$model" -u "127.0.0.1:$((PORT + 1))" -i grpc \
        --concurrency "$c" --processes "$processes" --warmup-s 1 --duration-s "$SECONDS_PER_RUN" \
        --json "$json" >/dev/null 2>&1 || echo "bench failed for $server $model c=$c"
      stop_server "$server" "$pid"
      "$ROOT/.venv/bin/python" - "$json" "$model" "$c" "$server" <<'PY'
import json, sys
path, model, c, server = sys.argv[1:]
level = json.load(open(path))["levels"][0]
ms = level["latency_ms"]
print(f"{model:5} c={c:<3} {server:9} {level['throughput']:9.0f} req/s  p50 {ms['p50']:.2f} ms"
      f"  p99 {ms['p99']:.2f} ms  errors {sum(level['errors'].values())}")
PY
    done
  done
done
