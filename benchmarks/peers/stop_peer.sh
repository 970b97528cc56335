#!/usr/bin/env bash
# Stop a peer started by run_peer.sh: SIGINT to its process group (PyTriton, MLServer, Mosec
# and LitServe all shut down their workers on it), then SIGKILL whatever is left after 40 s.
#   usage: benchmarks/peers/stop_peer.sh PID
set -uo pipefail
PID="${1:?usage: $0 PID}"
kill -INT -- "-$PID" 2>/dev/null || { echo "no process group $PID" >&2; exit 1; }
for _ in $(seq 1 80); do
  pgrep -g "$PID" >/dev/null || { echo "stopped $PID"; exit 0; }
  sleep 0.5
done
kill -KILL -- "-$PID" 2>/dev/null
echo "killed $PID (did not stop within 40 s)"
