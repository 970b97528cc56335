#!/usr/bin/env bash
# CPU per request of each process of `--workers N --engine` (the engine, each front end) under
# wrk at CONNS connections, for one or more source trees, alternating ROUNDS times: what a
# change moves from the engine's one event loop to the front ends.
#   usage: benchmarks/peers/engine_cpu.sh [SECONDS] [ROUNDS] [CONNS] [MODEL] [N] [SRC...]
#   (default: 5 2 64 tiny 2 <this checkout's src>; a SRC is a directory holding `inferd/`,
#   e.g. `git archive <commit> src | tar -x -C /tmp/before` then /tmp/before/src)
# CPU is utime + stime from /proc/PID/stat (clock ticks: 10 ms each), read before and after
# the wrk run, divided by the requests wrk completed. V2_INPUT=WRONG (v2_infer.lua) sends a
# request with an unknown input each time: what a bad request costs each process.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
SECS="${1:-5}"; ROUNDS="${2:-2}"; CONNS="${3:-64}"; MODEL="${4:-tiny}"; N="${5:-2}"
shift 5 || shift $#
SRCS=("${@:-$ROOT/src}")
PORT=18900
"$ROOT/.venv/bin/python" "$HERE/inferd_repo.py" "$HERE/results/inferd_repo" >/dev/null
SERVER_CHECK=("$ROOT/.venv/bin/python" "$ROOT/tests/support/server_process.py")
ticks() {  # $1 pid -> utime + stime (fields 14 and 15, counted after the command's ")")
  local stat; stat=$(<"/proc/$1/stat"); stat=${stat##*) }
  read -r -a f <<<"$stat"; echo $(( f[11] + f[12] ))
}
hz=$(getconf CLK_TCK)
for round in $(seq "$ROUNDS"); do
  order=("${SRCS[@]}")  # odd rounds in the order given, even ones reversed: no tree always first
  if (( round % 2 == 0 )); then mapfile -t order < <(printf '%s\n' "${SRCS[@]}" | tac); fi
  for src in "${order[@]}"; do
    "${SERVER_CHECK[@]}" check-free "$PORT" >&2
    log="$HERE/results/engine-cpu-$PORT.log"
    PYTHONPATH="$src" setsid "$ROOT/.venv/bin/inferd" serve \
      --model-repository "$HERE/results/inferd_repo" --http-port "$PORT" \
      --grpc-port "$((PORT + 1))" --metrics-port 0 --log-level INFO --workers "$N" --engine \
      > "$log" 2>&1 &
    pid=$!
    "${SERVER_CHECK[@]}" wait "$pid" "$PORT" "/v2/models/$MODEL/ready" --listeners "$N" \
      --log "$log" >&2
    mapfile -t pids < <(grep -o 'worker [0-9]* started (pid [0-9]*)' "$log" |
      awk '{gsub(/\)/, "", $5); print $2 ":" $5}' | sort -t: -k1,1n -u)
    declare -A before=()
    for p in "${pids[@]}"; do before[$p]=$(ticks "${p#*:}"); done
    wrk -t1 -c"$CONNS" -d"${SECS}s" -s "$HERE/v2_infer.lua" \
      "http://127.0.0.1:$PORT/v2/models/$MODEL/infer" > "$log.wrk"
    n=$(awk '/requests in/ {print $1}' "$log.wrk")
    line="round $round $(basename "$(dirname "$src")")/$(basename "$src") $MODEL c=$CONNS"
    line+=" $(awk '/Requests\/sec/ {print $2}' "$log.wrk") req/s"
    line+=" non-2xx $(awk '/Non-2xx/ {print $NF}' "$log.wrk" | grep . || echo 0)"
    engine=0 fronts=0
    for p in "${pids[@]}"; do
      t=$(( $(ticks "${p#*:}") - before[$p] ))
      if [[ "${p%%:*}" == "$N" ]]; then engine=$t; else fronts=$(( fronts + t )); fi
    done
    per() { python3 -c "print(f'{$1 / $hz * 1e6 / $n:.1f}')"; }
    line+=" | CPU per request: engine $(per $engine) µs, front ends (all) $(per $fronts) µs"
    echo "$line"
    kill -INT -- "-$pid" 2>/dev/null || true
    for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    unset before
  done
done
