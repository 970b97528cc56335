#!/usr/bin/env bash
# A 4 MiB input three ways, side by side: system shared memory against the binary HTTP
# body and gRPC's raw contents, with Triton's perf_analyzer, modes alternating round by round.
#   usage: benchmarks/shm_perf_analyzer.sh [rounds] [concurrency]   (default: 3 rounds, 1)
# Each run is three 2-second windows, taken whatever their spread (a busy shared machine may
# never meet perf_analyzer's stability criterion); the rounds and the medians are what
# smooth the noise.
# The model takes the mean of each row (INPUT0 FP32 [1, 1048576] -> OUTPUT0 [1, 1]), so what
# differs between modes is how the 4 MiB reach the model. In the shared-memory modes
# perf_analyzer writes the input into its region once, as a producer that builds its tensors
# in shared memory would; the output (4 bytes) goes to a region too.
# Prints one line per run and a summary (the median of the rounds); CSVs go to
# benchmarks/results/shm-<mode>-r<round>.csv.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

ROUNDS="${1:-3}"
CONCURRENCY="${2:-1}"
PORT_HTTP=18100; PORT_GRPC=18101
ELEMENTS=1048576  # 4 MiB of FP32
mkdir -p benchmarks/results
REPO="$(mktemp -d)"

.venv/bin/python - "$REPO" <<'PY'
import sys
from pathlib import Path

import onnx
from onnx import TensorProto, helper

graph = helper.make_graph(
    [helper.make_node("ReduceMean", ["INPUT0"], ["OUTPUT0"], axes=[1], keepdims=1)],
    "row_mean",
    [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", "n"])],
    [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", 1])],
)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
path = Path(sys.argv[1]) / "row_mean" / "1" / "model.onnx"
path.parent.mkdir(parents=True)
onnx.save(model, str(path))
PY

.venv/bin/inferd serve --model-repository "$REPO" --http-port "$PORT_HTTP" \
  --grpc-port "$PORT_GRPC" --metrics-port 0 --log-level WARNING &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null || true; rm -rf "$REPO"' EXIT
for _ in $(seq 150); do
  curl -sf "127.0.0.1:$PORT_HTTP/v2/health/ready" >/dev/null && break
  sleep 0.2
done

MODES=(http grpc http-shm grpc-shm)
for round in $(seq "$ROUNDS"); do
  for mode in "${MODES[@]}"; do
    protocol="${mode%-shm}"
    url="127.0.0.1:$PORT_HTTP"; [[ "$protocol" == grpc ]] && url="127.0.0.1:$PORT_GRPC"
    extra=()
    [[ "$mode" == *-shm ]] && extra=(--shared-memory system --output-shared-memory-size 64)
    csv="benchmarks/results/shm-$mode-r$round.csv"
    benchmarks/perf_analyzer.sh -m row_mean -u "$url" -i "$protocol" "${extra[@]}" \
      --shape "INPUT0:$ELEMENTS" --input-data random --concurrency-range "$CONCURRENCY" \
      --measurement-interval 2000 --stability-percentage 1000 --max-trials 3 \
      -f "$csv" >/dev/null
    # CSV columns: Inferences/Second is 2nd; p50, p90, p99 latency (µs) by name.
    .venv/bin/python - "$mode" "$round" "$csv" <<'PY'
import csv, sys
mode, rnd, path = sys.argv[1:]
row = next(csv.DictReader(open(path)))
print(f"round {rnd} {mode:9s} {float(row['Inferences/Second']):8.1f} infer/s  "
      f"p50 {int(row['p50 latency'])/1000:6.2f} ms  p90 {int(row['p90 latency'])/1000:6.2f} ms  "
      f"p99 {int(row['p99 latency'])/1000:6.2f} ms")
PY
  done
done

echo "== median of $ROUNDS rounds, concurrency $CONCURRENCY, 4 MiB FP32 input"
.venv/bin/python - "$ROUNDS" "${MODES[@]}" <<'PY'
import csv, statistics, sys
rounds, modes = int(sys.argv[1]), sys.argv[2:]
print("| mode | throughput (infer/s) | p50 | p90 | p99 |")
print("|---|---:|---:|---:|---:|")
for mode in modes:
    rows = [next(csv.DictReader(open(f"benchmarks/results/shm-{mode}-r{r}.csv")))
            for r in range(1, rounds + 1)]
    med = lambda key: statistics.median(float(r[key]) for r in rows)
    print(f"| {mode} | {med('Inferences/Second'):,.0f} | {med('p50 latency')/1000:.2f} ms "
          f"| {med('p90 latency')/1000:.2f} ms | {med('p99 latency')/1000:.2f} ms |")
PY
