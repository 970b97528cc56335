#!/usr/bin/env bash
# Throughput of the example MLP with telemetry on (defaults: metrics, 1% request log)
# and off (--metrics-port 0 --log-sample-rate 0), alternating, with perf_analyzer over HTTP.
#   usage: benchmarks/telemetry_cost.sh [concurrency] [rounds]     (default: 64 2)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
C="${1:-64}"; ROUNDS="${2:-2}"; PORT=18300
make --no-print-directory models >/dev/null

run() {  # $1: label, rest: extra inferd flags
  local label="$1"; shift
  .venv/bin/inferd serve --model-repository examples/models --http-port "$PORT" --grpc-port 0 \
    --log-level WARNING "$@" &
  local server=$!
  for _ in $(seq 100); do curl -sf "127.0.0.1:$PORT/v2/health/ready" >/dev/null && break; sleep 0.2; done
  local out
  out=$(benchmarks/perf_analyzer.sh -m mlp -u "127.0.0.1:$PORT" -i http --concurrency-range "$C" \
    --measurement-interval 5000 --stability-percentage 20 --max-trials 20 --percentile=99 \
    | grep -E "Throughput:|p99 latency" | tr -s ' ' | tr '\n' ' ')
  echo "$label c=$C: $out"
  kill "$server"; wait "$server" 2>/dev/null || true
}

for round in $(seq "$ROUNDS"); do
  run "telemetry on " --metrics-port 18302
  run "telemetry off" --metrics-port 0 --log-sample-rate 0
done
