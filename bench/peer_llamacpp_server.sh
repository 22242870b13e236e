#!/usr/bin/env bash
# peer_llamacpp_server.sh — start llama.cpp's OpenAI-compatible server (llama-cpp-python) on
# loopback as the comparison peer for bench/loadgen.py, wait until it answers GET /v1/models,
# and print its PID on stdout (the only stdout line; logs go to the log file).
#
# Usage: bench/peer_llamacpp_server.sh [-m MODEL.gguf] [-p PORT] [-c N_CTX] [-t THREADS]
#                                      [-l LOGFILE] [-w WAIT_S]
#   defaults: -m ${FLASHDLLM_SHARED:-../shared}/models/codelm-16m-f16.gguf -p 8091 -c 1024
#             -t (llama-cpp-python's default) -l /tmp/peer_llamacpp_PORT.log -w 120
# Stop it with: kill PID
#
# Needs: pip install 'llama-cpp-python[server]' (the server extra brings fastapi, uvicorn,
# sse-starlette, pydantic-settings). Binds 127.0.0.1 only.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
shared="${FLASHDLLM_SHARED:-$here/../../shared}"
model="$shared/models/codelm-16m-f16.gguf"
port=8091
n_ctx=1024
threads=""
log=""
wait_s=120

while getopts "m:p:c:t:l:w:h" opt; do
  case "$opt" in
    m) model="$OPTARG" ;;
    p) port="$OPTARG" ;;
    c) n_ctx="$OPTARG" ;;
    t) threads="$OPTARG" ;;
    l) log="$OPTARG" ;;
    w) wait_s="$OPTARG" ;;
    h) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "usage: see $0 -h" >&2; exit 1 ;;
  esac
done
log="${log:-/tmp/peer_llamacpp_${port}.log}"

[[ "$port" =~ ^[0-9]+$ ]] && (( port >= 1 && port <= 65535 )) || { echo "bad port: $port" >&2; exit 1; }
[[ -f "$model" ]] || { echo "model not found: $model" >&2; exit 1; }
python3 -c "import llama_cpp.server, uvicorn, fastapi, sse_starlette" 2>/dev/null || {
  echo "llama-cpp-python server extra missing: pip install 'llama-cpp-python[server]'" >&2; exit 1; }
if curl -s -o /dev/null "http://127.0.0.1:$port/"; then
  echo "port $port is already in use" >&2; exit 1
fi

# --interrupt_requests False: by default llama-cpp-python's server cuts the running stream
# short whenever a new request arrives, which under load would end most streams after one
# chunk and make the peer look fast; with it off, requests wait their turn (one at a time).
args=(--model "$model" --host 127.0.0.1 --port "$port" --n_ctx "$n_ctx" --interrupt_requests False)
[[ -n "$threads" ]] && args+=(--n_threads "$threads")
# setsid: the server keeps running after this script exits, in its own process group.
setsid python3 -m llama_cpp.server "${args[@]}" >"$log" 2>&1 < /dev/null &
pid=$!

deadline=$((SECONDS + wait_s))
until curl -sf "http://127.0.0.1:$port/v1/models" >/dev/null; do
  if ! kill -0 "$pid" 2>/dev/null; then
    echo "llama.cpp server exited during startup; last log lines ($log):" >&2
    tail -n 20 "$log" >&2
    exit 1
  fi
  if (( SECONDS >= deadline )); then
    echo "llama.cpp server did not answer /v1/models within ${wait_s} s; see $log" >&2
    kill "$pid" 2>/dev/null || true
    exit 1
  fi
  sleep 0.5
done
echo "$pid"
