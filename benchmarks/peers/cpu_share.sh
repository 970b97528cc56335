#!/usr/bin/env bash
# Where the bound is: a server's CPU per request, and the machine's idle cores, under wrk.
#   usage: benchmarks/peers/cpu_share.sh SERVER MODEL [CONNS] [SECONDS]
#   (SERVER: inferd, inferd-wN for N workers, a peer of setup.sh, or mosec-wN)
# Prints req/s, the server's CPU (all its processes: user + system from /proc, in cores and
# in µs per request) and how many of the machine's cores stayed idle meanwhile.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
SERVER="$1"; MODEL="$2"; CONNS="${3:-64}"; SECS="${4:-8}"
PORT=18900
"$ROOT/.venv/bin/python" "$HERE/inferd_repo.py" "$HERE/results/inferd_repo" >/dev/null
# shellcheck source=servers.sh
source "$HERE/servers.sh"

pid=$(start_server "$SERVER" "$MODEL")
sleep 1
pgid=$(ps -o pgid= -p "$pid" | tr -d ' ')
server_ticks() {  # user + system ticks of the server's processes (workers have own groups)
  local t=0 p f
  for p in $( (pgrep -g "$pgid"; pgrep -P "$pid") | sort -u); do
    read -r -a f < "/proc/$p/stat" 2>/dev/null || continue
    t=$((t + f[13] + f[14]))
  done
  echo "$t"
}
machine() { awk '/^cpu / {print $5+$6, $2+$3+$4+$5+$6+$7+$8}' /proc/stat; }
c0=$(server_ticks); read -r i0 t0 <<<"$(machine)"
out=$(wrk -t1 -c"$CONNS" -d"${SECS}s" -s "$HERE/v2_infer.lua" \
  "http://127.0.0.1:$PORT/v2/models/$MODEL/infer")
c1=$(server_ticks); read -r i1 t1 <<<"$(machine)"
stop_server "$SERVER" "$pid"
rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
python3 - "$SERVER" "$MODEL" "$CONNS" "$SECS" "$rps" "$c0" "$c1" "$i0" "$i1" "$t0" "$t1" <<'PY'
import os, sys
server, model, conns, secs, rps, c0, c1, i0, i1, t0, t1 = sys.argv[1:]
secs, rps = float(secs), float(rps)
hz = os.sysconf("SC_CLK_TCK")
cores = os.cpu_count() or 1
server_cores = (int(c1) - int(c0)) / hz / secs
idle_cores = (int(i1) - int(i0)) / (int(t1) - int(t0)) * cores
print(f"{server} {model} c={conns}: {rps:,.0f} req/s, server CPU {server_cores:.2f} cores "
      f"= {server_cores / rps * 1e6:.1f} us/request, machine idle {idle_cores:.2f} of {cores} cores")
PY
