#!/usr/bin/env bash
# Load a sequence model (implicit state on ONNX Runtime) with Triton's perf_analyzer, which
# sends whole sequences (sequence_id / start / end) when the model has sequence_batching.
#   usage: [MODEL=acc_onnx] [SEQUENCE_LENGTH=10] benchmarks/sequences_perf_analyzer.sh \
#            [http|grpc] [concurrency ...]      (default: grpc, concurrency 1 8 32)
# MODEL is one of the test repository's sequence models (tests/support/sequence_models.py):
# acc_onnx (direct, 2 instances x 4 slots), acc (Python, oldest), acc_triton (Triton Python).
# A concurrency of N runs N sequences at once; above the model's slots the rest wait in the
# backlog. Results are printed and written to benchmarks/results/seq-<model>-<protocol>-c<N>.csv.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PROTOCOL="${1:-grpc}"; shift || true
LEVELS=("${@:-1 8 32}"); LEVELS=(${LEVELS[@]})
MODEL="${MODEL:-acc_onnx}"
LENGTH="${SEQUENCE_LENGTH:-10}"
# Its own server on ports free at run time, checked to be the one answering there (and
# still alive at the end): tests/support/server_process.py.
SERVER_CHECK=(.venv/bin/python tests/support/server_process.py)
PORT_HTTP="$("${SERVER_CHECK[@]}" free-port)"; PORT_GRPC="$("${SERVER_CHECK[@]}" free-port)"
mkdir -p benchmarks/results
REPO="$(mktemp -d)"

.venv/bin/python -c "
import sys; sys.path.insert(0, '.')
from pathlib import Path
from tests.support.sequence_models import build_sequence_repository
build_sequence_repository(Path(sys.argv[1]))
" "$REPO"
.venv/bin/inferd serve --model-repository "$REPO" --http-port "$PORT_HTTP" \
  --grpc-port "$PORT_GRPC" --metrics-port 0 --log-level WARNING &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null || true; rm -rf "$REPO"' EXIT
"${SERVER_CHECK[@]}" wait "$SERVER" "$PORT_HTTP" /v2/health/ready
"${SERVER_CHECK[@]}" owns "$SERVER" "$PORT_GRPC"

URL="127.0.0.1:$PORT_HTTP"; [[ "$PROTOCOL" == grpc ]] && URL="127.0.0.1:$PORT_GRPC"
for c in "${LEVELS[@]}"; do
  echo "== $MODEL $PROTOCOL concurrency $c (sequences of $LENGTH)"
  benchmarks/perf_analyzer.sh -m "$MODEL" -u "$URL" -i "$PROTOCOL" \
    --concurrency-range "$c" --sequence-length "$LENGTH" --measurement-interval 5000 \
    --percentile=99 --stability-percentage 30 --max-trials 20 \
    -f "benchmarks/results/seq-$MODEL-$PROTOCOL-c$c.csv" \
    | grep -E "Concurrency:|p50 latency|p90 latency|p99 latency|Throughput|Execution count|Inference count" || true
done
"${SERVER_CHECK[@]}" owns "$SERVER" "$PORT_HTTP"  # the figures above are of our server
echo "== failures counted by the server"
curl -s "127.0.0.1:$PORT_HTTP/v2/models/$MODEL/stats" | .venv/bin/python -c "
import json, sys
s = json.load(sys.stdin)['model_stats'][0]
print('fail', s['inference_stats']['fail']['count'], 'success', s['inference_stats']['success']['count'])
"
