#!/usr/bin/env bash
# Start one peer server in the background, wait until it answers an inference, print its PID.
#   usage: benchmarks/peers/run_peer.sh PEER MODEL PORT [EXTRA ARGS...]
#     PEER:  triton | mlserver | mosec | litserve      MODEL: tiny | mlp | minilm
#            (minilm: mlserver, mosec, litserve; text -> embedding, needs `make models`)
#     PORT:  HTTP port; gRPC (triton, mlserver) on PORT+1, metrics on PORT+2
#     EXTRA: passed to the server script (e.g. `--api native` for mosec, `--no-fast-queue` for litserve)
# The server runs in its own session/process group with the PID printed on stdout; stop it
# and its worker processes with benchmarks/peers/stop_peer.sh PID (SIGINT to the group, then
# SIGKILL after 40 s: tritonserver can take up to its 30 s exit timeout).
# Its log goes to benchmarks/peers/results/logs/PEER-MODEL-PORT[-EXTRA].log.
# Run benchmarks/peers/setup.sh PEER first.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
[[ $# -ge 3 ]] || { sed -n '2,10p' "$0" >&2; exit 2; }
PEER="$1" MODEL="$2" PORT="$3"; shift 3
case "$MODEL" in tiny|mlp|minilm) ;; *) echo "unknown model: $MODEL" >&2; exit 2 ;; esac

VENV="$HERE/.venv-$PEER"
[[ -x "$VENV/bin/python" ]] || { echo "no $VENV: run $HERE/setup.sh $PEER" >&2; exit 1; }
[[ -f "$HERE/results/models/mlp/1/model.onnx" ]] || { echo "no MLP model: run $HERE/setup.sh" >&2; exit 1; }
if [[ "$MODEL" == minilm ]]; then
  MINILM="${PEERS_MINILM_MODELS:-$HERE/../../examples/models}"
  [[ -f "$MINILM/minilm_encoder/1/model.onnx" && -f "$MINILM/minilm_tokenize/1/tokenizer.json" ]] \
    || { echo "no minilm model in $MINILM: run make models" >&2; exit 1; }
fi
mkdir -p "$HERE/results/logs"
SUFFIX=""
if [[ $# -gt 0 ]]; then SUFFIX="$(echo "-$*" | tr -cs 'A-Za-z0-9\n' '-')"; fi
LOG="$HERE/results/logs/$PEER-$MODEL-$PORT$SUFFIX.log"

if [[ "$MODEL" == tiny ]]; then IN=INPUT; else IN=input; fi
ZEROS="$(printf '0,%.0s' {1..63})0"
URL="http://127.0.0.1:$PORT/v2/models/$MODEL/infer"
BODY="{\"inputs\":[{\"name\":\"$IN\",\"shape\":[1,64],\"datatype\":\"FP32\",\"data\":[$ZEROS]}]}"
if [[ "$MODEL" == minilm ]]; then
  BODY='{"inputs":[{"name":"text","shape":[1,1],"datatype":"BYTES","data":["A man is playing a guitar."]}]}'
fi

case "$PEER" in
  triton)
    # PyTriton's Triton stub must load this interpreter's libpython, not the system one.
    LIBDIR="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_config_var("LIBDIR"))')"
    export LD_LIBRARY_PATH="$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    CMD=("$VENV/bin/python" "$HERE/triton_server.py" --model "$MODEL" --port "$PORT" "$@")
    ;;
  mlserver)
    # Server-wide settings as MLSERVER_* env vars (settings.json would have to live in the
    # model folder itself); one inference worker process, like the other peers.
    export MLSERVER_HTTP_PORT="$PORT" MLSERVER_GRPC_PORT="$((PORT + 1))" \
           MLSERVER_METRICS_PORT="$((PORT + 2))" MLSERVER_PARALLEL_WORKERS=1 \
           MLSERVER_DEBUG=false MLSERVER_METRICS_DIR="$HERE/results/mlserver-metrics-$PORT"
    mkdir -p "$MLSERVER_METRICS_DIR"
    export PYTHONPATH="$HERE/mlserver:$HERE${PYTHONPATH:+:$PYTHONPATH}"
    CMD=("$VENV/bin/mlserver" start "$HERE/mlserver/$MODEL")
    ;;
  mosec)
    CMD=("$VENV/bin/python" "$HERE/mosec_server.py" --model "$MODEL" --port "$PORT" "$@")
    if [[ " $* " == *" --api native "* ]]; then
      URL="http://127.0.0.1:$PORT/inference"; BODY="[$ZEROS]"
    fi
    ;;
  litserve)
    CMD=("$VENV/bin/python" "$HERE/litserve_server.py" --model "$MODEL" --port "$PORT" "$@")
    ;;
  *) echo "unknown peer: $PEER (triton|mlserver|mosec|litserve)" >&2; exit 2 ;;
esac

# The peer must be the one answering on PORT: the port free before it starts, and at the
# end every socket listening there its own (tests/support/server_process.py, standard library only).
SERVER_CHECK=(python3 "$HERE/../../tests/support/server_process.py")
"${SERVER_CHECK[@]}" check-free "$PORT" || exit 1

setsid "${CMD[@]}" >"$LOG" 2>&1 < /dev/null &
PID=$!

errors=0
for _ in $(seq 1 240); do   # up to 120 s
  if ! kill -0 "$PID" 2>/dev/null; then
    echo "$PEER $MODEL exited during start; last lines of $LOG:" >&2; tail -n 30 "$LOG" >&2; exit 1
  fi
  code="$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 -X POST \
          -H 'Content-Type: application/json' -d "$BODY" "$URL" || true)"
  if [[ "$code" == 200 ]]; then
    "${SERVER_CHECK[@]}" owns "$PID" "$PORT" || { kill -INT -- "-$PID" 2>/dev/null; exit 1; }
    echo "$PID"; exit 0
  fi
  if [[ "$code" != 000 && "$code" != 404 && "$code" != 503 ]] && (( ++errors >= 10 )); then
    echo "$PEER $MODEL answers HTTP $code to an inference; last lines of $LOG:" >&2
    tail -n 30 "$LOG" >&2; kill -INT -- "-$PID" 2>/dev/null || true; exit 1
  fi
  sleep 0.5
done
echo "$PEER $MODEL did not answer on $URL within 120 s (log: $LOG); stopping it" >&2
kill -INT -- "-$PID" 2>/dev/null || true
exit 1
