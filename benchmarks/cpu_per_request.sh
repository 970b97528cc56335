#!/usr/bin/env bash
# The server's CPU per request under wrk, for one or more source trees in turn (alternate them
# by naming each several times): the ticks of its /proc/PID/stat over a run, divided by the
# requests wrk counted. Preemption does not count in it, so it holds on a busy machine where
# requests per second move by 20%.
#   usage: benchmarks/cpu_per_request.sh MODEL SECONDS CONNECTIONS TREE [TREE...]
#   e.g.:  git worktree add ../before a9b058b
#          benchmarks/cpu_per_request.sh tiny 5 64 ../before . ../before . ../before .
# MODEL is the peers' tiny or mlp (benchmarks/peers/inferd_repo.py); each TREE's src/ runs
# with this checkout's .venv. Needs wrk (Debian: apt-get install wrk).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
MODEL=$1 SECS=$2 CONNS=$3; shift 3
REPO="$(mktemp -d)/models"
.venv/bin/python benchmarks/peers/inferd_repo.py "$REPO" >/dev/null
CHECK=(.venv/bin/python tests/support/server_process.py)
URL_PATH="/v2/models/$MODEL/infer"
for tree in "$@"; do
  src="$(cd "$tree" && pwd)/src"
  port="$("${CHECK[@]}" free-port)" grpc="$("${CHECK[@]}" free-port)"
  log="$(mktemp)"
  PYTHONPATH="$src" setsid .venv/bin/python -m inferd serve --model-repository "$REPO" \
    --http-port "$port" --grpc-port "$grpc" --metrics-port 0 --log-level WARNING >"$log" 2>&1 &
  pid=$!
  "${CHECK[@]}" wait "$pid" "$port" "/v2/models/$MODEL/ready" --log "$log"
  wrk -t1 -c"$CONNS" -d2s -s benchmarks/peers/v2_infer.lua "http://127.0.0.1:$port$URL_PATH" >/dev/null
  t0=$(awk '{print $14 + $15}' "/proc/$pid/stat")
  n=$(wrk -t1 -c"$CONNS" -d"${SECS}s" -s benchmarks/peers/v2_infer.lua \
    "http://127.0.0.1:$port$URL_PATH" | awk '/requests in/ {print $1}')
  t1=$(awk '{print $14 + $15}' "/proc/$pid/stat")
  ticks=$((t1 - t0)) hz=$(getconf CLK_TCK)
  echo "$tree $MODEL c$CONNS: $n requests, $ticks ticks, $(python3 -c "print(round($ticks * 1e6 / $hz / $n, 1))") us/request"
  kill -INT -- "-$pid"; wait "$pid" 2>/dev/null || true
done
