#!/usr/bin/env bash
# Serve the example models with inferd and load the ONNX MLP with Triton's perf_analyzer.
#   usage: [MODEL=mlp_torch] benchmarks/mlp_perf_analyzer.sh [http|grpc] [concurrency ...]
#   (default: MODEL=mlp, http, concurrency 1 8 64)
# Results are printed and written to benchmarks/results/<model>-<protocol>-c<N>.csv.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PROTOCOL="${1:-http}"; shift || true
LEVELS=("${@:-1 8 64}"); LEVELS=(${LEVELS[@]})
MODEL="${MODEL:-mlp}"
# Its own server on ports free at run time, checked to be the one answering there (and
# still alive at the end): tests/support/server_process.py.
SERVER_CHECK=(.venv/bin/python tests/support/server_process.py)
PORT_HTTP="$("${SERVER_CHECK[@]}" free-port)"; PORT_GRPC="$("${SERVER_CHECK[@]}" free-port)"
mkdir -p benchmarks/results

make --no-print-directory models >/dev/null
.venv/bin/inferd serve --model-repository examples/models --http-port "$PORT_HTTP" \
  --grpc-port "$PORT_GRPC" --metrics-port 0 \
  --log-level WARNING &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null || true' EXIT
"${SERVER_CHECK[@]}" wait "$SERVER" "$PORT_HTTP" /v2/health/ready
"${SERVER_CHECK[@]}" owns "$SERVER" "$PORT_GRPC"

URL="127.0.0.1:$PORT_HTTP"; [[ "$PROTOCOL" == grpc ]] && URL="127.0.0.1:$PORT_GRPC"
for c in "${LEVELS[@]}"; do
  echo "== $MODEL $PROTOCOL concurrency $c"
  benchmarks/perf_analyzer.sh -m "$MODEL" -u "$URL" -i "$PROTOCOL" \
    --concurrency-range "$c" --measurement-interval 5000 --percentile=99 \
    --stability-percentage 20 --max-trials 20 \
    --input-data random -f "benchmarks/results/$MODEL-$PROTOCOL-c$c.csv" \
    | grep -E "Concurrency:|p50 latency|p90 latency|p99 latency|Throughput" || true
done
"${SERVER_CHECK[@]}" owns "$SERVER" "$PORT_HTTP"  # the figures above are of our server
