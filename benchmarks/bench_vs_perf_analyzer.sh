#!/usr/bin/env bash
# inferd bench against Triton's perf_analyzer on one inferd server, alternating, with the
# server pinned to one core and the load generator to the other, so that the generator's
# own CPU use cannot change the server's speed between the two tools.
#   usage: benchmarks/bench_vs_perf_analyzer.sh [ROUNDS] [CONCURRENCY...]   (default: 2  1 8)
# (Not 64: perf_analyzer on one core at 64 connections grew past 11 GB and never settled.)
# Needs: make models (examples/models), benchmarks/perf_analyzer.sh's set-up, 2+ cores.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ROUNDS="${1:-2}"; shift || true
LEVELS=("${@:-1 8}"); LEVELS=(${LEVELS[@]})
# Its own server on a port free at run time, checked to be the one answering there (and
# still alive at the end): tests/support/server_process.py.
SERVER_CHECK=("$ROOT/.venv/bin/python" "$ROOT/tests/support/server_process.py")
PORT="$("${SERVER_CHECK[@]}" free-port)"
OUT="$ROOT/benchmarks/results/bench_vs_pa"; mkdir -p "$OUT"
SERVER_CPU=0; CLIENT_CPU=1

taskset -c "$SERVER_CPU" "$ROOT/.venv/bin/inferd" serve --model-repository "$ROOT/examples/models" \
  --http-port "$PORT" --grpc-port 0 --metrics-port 0 --log-level WARNING \
  > "$OUT/server.log" 2>&1 &
server=$!
trap 'kill -INT $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT
"${SERVER_CHECK[@]}" wait "$server" "$PORT" /v2/models/mlp/ready --log "$OUT/server.log"

echo "concurrency,tool,round,infer_per_s,p50_ms,p99_ms"
for c in "${LEVELS[@]}"; do
  for round in $(seq "$ROUNDS"); do
    taskset -c "$CLIENT_CPU" "$ROOT/benchmarks/perf_analyzer.sh" -m mlp -u "127.0.0.1:$PORT" \
      -i http --concurrency-range "$c" --measurement-interval 5000 --stability-percentage 10 \
      --max-trials 20 -f "$OUT/pa-$c-$round.csv" > "$OUT/pa-$c-$round.txt" 2>&1
    python3 - "$OUT/pa-$c-$round.csv" "$c" "$round" <<'PY'
import csv, sys
row = next(csv.DictReader(open(sys.argv[1])))
print(f"{sys.argv[2]},perf_analyzer,{sys.argv[3]},{float(row['Inferences/Second']):.0f},"
      f"{int(row['p50 latency']) / 1000:.3f},{int(row['p99 latency']) / 1000:.3f}")
PY
    taskset -c "$CLIENT_CPU" "$ROOT/.venv/bin/inferd" bench -m mlp -u "127.0.0.1:$PORT" \
      --concurrency "$c" --window-s 5 --stability-percentage 10 --max-windows 20 --http-binary \
      --json "$OUT/bench-$c-$round.json" > "$OUT/bench-$c-$round.txt" 2>&1
    python3 - "$OUT/bench-$c-$round.json" "$c" "$round" <<'PY'
import json, sys
level = json.load(open(sys.argv[1]))["levels"][0]
print(f"{sys.argv[2]},inferd bench,{sys.argv[3]},{level['throughput']:.0f},"
      f"{level['latency_ms']['p50']:.3f},{level['latency_ms']['p99']:.3f}")
PY
  done
done
"${SERVER_CHECK[@]}" owns "$server" "$PORT"  # the figures above are of our server
