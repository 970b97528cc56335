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

start() {  # $1 server, $2 model -> prints a PID
  if [[ "$1" == inferd ]]; then
    setsid "$ROOT/.venv/bin/inferd" serve --model-repository "$HERE/results/inferd_repo" \
      --http-port "$PORT" --grpc-port "$((PORT + 1))" --metrics-port 0 --log-level WARNING \
      > "$HERE/results/inferd-grpc-$2.log" 2>&1 &
    local pid=$!
    for _ in $(seq 150); do
      curl -sf "127.0.0.1:$PORT/v2/models/$2/ready" >/dev/null && break; sleep 0.2
    done
    echo "$pid"
  else
    "$HERE/run_peer.sh" "$1" "$2" "$PORT"
  fi
}

stop() {  # $1 server, $2 pid
  if [[ "$1" == inferd ]]; then
    kill -INT -- "-$2" 2>/dev/null || kill -INT "$2" 2>/dev/null
    for _ in $(seq 300); do kill -0 "$2" 2>/dev/null || return 0; sleep 0.1; done
    kill -KILL -- "-$2" 2>/dev/null || true
  else
    "$HERE/stop_peer.sh" "$2" >/dev/null
  fi
}

for model in tiny mlp; do
  for c in 1 8 64; do
    processes=1; [[ "$c" -ge 64 ]] && processes=2
    for server in "${SERVERS[@]}"; do
      pid=$(start "$server" "$model")
      json="$HERE/results/grpc-$server-$model-c$c.json"
      "$ROOT/.venv/bin/inferd" bench -m "$model" -u "127.0.0.1:$((PORT + 1))" -i grpc \
        --concurrency "$c" --processes "$processes" --warmup-s 1 --duration-s "$SECONDS_PER_RUN" \
        --json "$json" >/dev/null 2>&1 || echo "bench failed for $server $model c=$c"
      stop "$server" "$pid"
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
