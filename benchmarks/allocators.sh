#!/usr/bin/env bash
# The example MLP served with glibc's malloc, jemalloc and tcmalloc (LD_PRELOAD, as the
# image's ALLOCATOR build argument offers), side by side: throughput and p99 from
# `inferd bench` over HTTP, and the server's resident memory after the load (VmRSS) and at
# its peak (VmHWM). Debian's libjemalloc2 and libtcmalloc-minimal4 must be installed.
#   usage: benchmarks/allocators.sh [concurrency] [seconds] [rounds]   (default: 16 20 2)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
C="${1:-16}"; SECONDS_EACH="${2:-20}"; ROUNDS="${3:-2}"
SERVER_CHECK=(.venv/bin/python tests/support/server_process.py)
LIBDIR=/usr/lib/$(gcc -dumpmachine 2>/dev/null || echo x86_64-linux-gnu)
declare -A PRELOAD=(
  [glibc]=""
  [jemalloc]="$LIBDIR/libjemalloc.so.2"
  [tcmalloc]="$LIBDIR/libtcmalloc_minimal.so.4"
)
for lib in "${PRELOAD[@]}"; do
  [ -z "$lib" ] || [ -e "$lib" ] || { echo "missing $lib (apt-get install libjemalloc2 libtcmalloc-minimal4)" >&2; exit 1; }
done
make --no-print-directory models >/dev/null

run() {  # $1: allocator
  local name="$1" port out json
  port="$("${SERVER_CHECK[@]}" free-port)"
  json=$(mktemp)
  LD_PRELOAD="${PRELOAD[$name]}" .venv/bin/inferd serve --model-repository examples/models \
    --http-port "$port" --grpc-port 0 --metrics-port 0 --log-level WARNING &
  local server=$!
  "${SERVER_CHECK[@]}" wait "$server" "$port" /v2/health/ready || { kill "$server" 2>/dev/null; exit 1; }
  local idle_rss; idle_rss=$(awk '/VmRSS/ {print $2}' "/proc/$server/status")
  .venv/bin/inferd bench -m mlp -u "127.0.0.1:$port" --concurrency "$C" --warmup-s 3 \
    --duration-s "$SECONDS_EACH" --json "$json" >/dev/null
  "${SERVER_CHECK[@]}" owns "$server" "$port" || { kill "$server" 2>/dev/null; exit 1; }
  local rss hwm; rss=$(awk '/VmRSS/ {print $2}' "/proc/$server/status"); hwm=$(awk '/VmHWM/ {print $2}' "/proc/$server/status")
  .venv/bin/python - "$json" "$name" "$C" "$idle_rss" "$rss" "$hwm" <<'PY'
import json, sys
path, name, c, idle, rss, hwm = sys.argv[1:]
level = json.load(open(path))["levels"][0]
print(f"{name:9} c={c}: {level['throughput']:8.1f} req/s  p99 {level['latency_ms']['p99']:6.2f} ms  "
      f"RSS idle {int(idle)/1024:6.1f} MiB  after {int(rss)/1024:6.1f} MiB  peak {int(hwm)/1024:6.1f} MiB")
PY
  rm -f "$json"
  kill "$server"; wait "$server" 2>/dev/null || true
}

for round in $(seq "$ROUNDS"); do
  for name in glibc jemalloc tcmalloc; do run "$name"; done
done
