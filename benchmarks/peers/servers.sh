# Start and stop inferd or a peer for the compare scripts (sourced, not run).
# Needs HERE, ROOT and PORT set; inferd serves HTTP on PORT and gRPC on PORT+1, as the peers.

start_server() {  # $1 server (inferd, inferd-wN: N workers, a peer, mosec-wN), $2 model -> a PID
  if [[ "$1" == inferd* ]]; then
    local workers=1
    [[ "$1" == inferd-w* ]] && workers="${1#inferd-w}"
    setsid "$ROOT/.venv/bin/inferd" serve --model-repository "$HERE/results/inferd_repo" \
      --http-port "$PORT" --grpc-port "$((PORT + 1))" --metrics-port 0 --log-level WARNING \
      --workers "$workers" > "$HERE/results/$1-$2-$PORT.log" 2>&1 &
    local pid=$!
    for _ in $(seq 150); do
      curl -sf "127.0.0.1:$PORT/v2/models/$2/ready" >/dev/null && break; sleep 0.2
    done
    # Ready answers once one worker is up; give the others their (parallel) start too.
    [[ "$workers" -gt 1 ]] && sleep 3
    echo "$pid"
  elif [[ "$1" == mosec-w* ]]; then  # Mosec with N Python worker processes
    "$HERE/run_peer.sh" mosec "$2" "$PORT" --workers "${1#mosec-w}"
  else
    "$HERE/run_peer.sh" "$1" "$2" "$PORT"
  fi
}

stop_server() {  # $1 server, $2 pid
  if [[ "$1" == inferd* ]]; then
    kill -INT -- "-$2" 2>/dev/null || kill -INT "$2" 2>/dev/null
    for _ in $(seq 300); do kill -0 "$2" 2>/dev/null || return 0; sleep 0.1; done
    kill -KILL -- "-$2" 2>/dev/null || true
  else
    "$HERE/stop_peer.sh" "$2" >/dev/null
  fi
}
