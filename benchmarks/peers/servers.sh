# Start and stop inferd or a peer for the compare scripts (sourced, not run).
# Needs HERE, ROOT and PORT set; inferd serves HTTP on PORT and gRPC on PORT+1, as the peers.

# inferd is checked to be the one answering on PORT (tests/support/server_process.py): the port is
# free before it starts, and when it is stopped every socket listening there is still its own
# (so the figures measured meanwhile are of it).
SERVER_CHECK=("$ROOT/.venv/bin/python" "$ROOT/tests/support/server_process.py")

start_server() {  # $1 server (inferd, inferd-wN: N workers, inferd-eN: N front ends and one
  # engine, a peer, mosec-wN), $2 model -> a PID
  if [[ "$1" == inferd* ]]; then
    local workers=1 engine=()
    [[ "$1" == inferd-w* ]] && workers="${1#inferd-w}"
    [[ "$1" == inferd-e* ]] && workers="${1#inferd-e}" && engine=(--engine)
    "${SERVER_CHECK[@]}" check-free "$PORT" >&2 || return 1
    "${SERVER_CHECK[@]}" check-free "$((PORT + 1))" >&2 || return 1
    local log="$HERE/results/$1-$2-$PORT.log"
    setsid "$ROOT/.venv/bin/inferd" serve --model-repository "$HERE/results/inferd_repo" \
      --http-port "$PORT" --grpc-port "$((PORT + 1))" --metrics-port 0 --log-level WARNING \
      --workers "$workers" "${engine[@]}" > "$log" 2>&1 &
    local pid=$!
    # Ready answers once one worker is up; wait until every worker listens (each does once
    # its models are loaded).
    "${SERVER_CHECK[@]}" wait "$pid" "$PORT" "/v2/models/$2/ready" --listeners "$workers" \
      --log "$log" >&2 || { kill -INT -- "-$pid" 2>/dev/null; return 1; }
    echo "$pid"
  elif [[ "$1" == mosec-w* ]]; then  # Mosec with N Python worker processes
    "$HERE/run_peer.sh" mosec "$2" "$PORT" --workers "${1#mosec-w}"
  else
    "$HERE/run_peer.sh" "$1" "$2" "$PORT"
  fi
}

stop_server() {  # $1 server, $2 pid
  if [[ "$1" == inferd* ]]; then
    local ours=0
    "${SERVER_CHECK[@]}" owns "$2" "$PORT" >&2 || ours=1
    kill -INT -- "-$2" 2>/dev/null || kill -INT "$2" 2>/dev/null
    for _ in $(seq 300); do kill -0 "$2" 2>/dev/null || return "$ours"; sleep 0.1; done
    kill -KILL -- "-$2" 2>/dev/null || true
    return "$ours"
  else
    "$HERE/stop_peer.sh" "$2" >/dev/null
  fi
}
