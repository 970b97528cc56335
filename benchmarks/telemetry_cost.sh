#!/usr/bin/env bash
# Throughput of the example MLP with telemetry on (defaults: metrics, 1% request log)
# and off (--metrics-port 0 --log-sample-rate 0), alternating, with perf_analyzer over HTTP.
#   usage: benchmarks/telemetry_cost.sh [concurrency] [rounds]     (default: 64 2)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
C="${1:-64}"; ROUNDS="${2:-2}"
# Each server on ports free at run time, checked to be the one answering there (and still
# alive after its measurement): tests/support/server_process.py.
SERVER_CHECK=(.venv/bin/python tests/support/server_process.py)
make --no-print-directory models >/dev/null

run() {  # $1: label, rest: extra inferd flags
  local label="$1"; shift
  local port; port="$("${SERVER_CHECK[@]}" free-port)"
  .venv/bin/inferd serve --model-repository examples/models --http-port "$port" --grpc-port 0 \
    --log-level WARNING "$@" &
  local server=$!
  "${SERVER_CHECK[@]}" wait "$server" "$port" /v2/health/ready || { kill "$server" 2>/dev/null; exit 1; }
  local out
  out=$(benchmarks/perf_analyzer.sh -m mlp -u "127.0.0.1:$port" -i http --concurrency-range "$C" \
    --measurement-interval 5000 --stability-percentage 20 --max-trials 20 --percentile=99 \
    | grep -E "Throughput:|p99 latency" | tr -s ' ' | tr '\n' ' ')
  "${SERVER_CHECK[@]}" owns "$server" "$port" || { kill "$server" 2>/dev/null; exit 1; }
  echo "$label c=$C: $out"
  kill "$server"; wait "$server" 2>/dev/null || true
}

for round in $(seq "$ROUNDS"); do
  run "telemetry on " --metrics-port "$("${SERVER_CHECK[@]}" free-port)"
  run "telemetry off" --metrics-port 0 --log-sample-rate 0
done
