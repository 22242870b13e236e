#!/usr/bin/env bash
# Runs the README's CLI quick tour (the fenced block under "## Using the CLI") against this
# checkout's build, so the README stays the one place the tour is written down.
#
#   BUILD=build-cuda scripts/check_tour.sh     # build dir, default build
#
# Each command runs from the repository root as written, with `build/bin/flashdllm` replaced
# by "$BUILD/bin/flashdllm", under a timeout (TOUR_TIMEOUT seconds, default 60). A command
# with --json must print valid JSON. The `serve` command cannot run as written (it serves
# until stopped): it is started in the background on 127.0.0.1 with --port 0 (any free port),
# asked once for /health and once for /v1/completions (and the README's curl example is
# run against it when curl is installed), then stopped with SIGTERM; a trap stops it on any
# failure. Exit status: 0 when every command passed, 1 naming the first that failed.
# Without a default model ($FLASHDLLM_MODEL, models/stories260K.gguf,
# ../shared/models/stories260K.gguf) the check is skipped, as the integration tests are.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
BUILD=${BUILD%/}
timeout_s=${TOUR_TIMEOUT:-60}
readme=${TOUR_README:-README.md}  # another file only to test this script
bin="$BUILD/bin/flashdllm"

fail() { echo "check_tour: FAIL: $*" >&2; exit 1; }
show() {  # show FILE LABEL: the last lines of a command's output, on stderr
  [ -s "$1" ] || return 0
  echo "--- $2 (last 20 lines)" >&2; tail -n 20 "$1" >&2; echo >&2
}

[ -x "$bin" ] || fail "$bin not found (build first: scripts/build.sh, or set BUILD)"
command -v python3 >/dev/null || fail "python3 is needed to query the server"
if [ -z "${FLASHDLLM_MODEL:-}" ] && [ ! -f models/stories260K.gguf ] &&
   [ ! -f ../shared/models/stories260K.gguf ]; then
  echo "check_tour: skipped: no default model (set FLASHDLLM_MODEL or see README.md)" >&2
  exit 0
fi

work=$(mktemp -d)
server_pid=""
stop_server() {
  [ -n "$server_pid" ] || return 0
  if kill -0 "$server_pid" 2>/dev/null; then
    kill -TERM "$server_pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$server_pid" 2>/dev/null || true
  fi
  wait "$server_pid" 2>/dev/null || true
  server_pid=""
}
cleanup() { stop_server; rm -rf "$work"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

# The tour: lines of the first ```sh block after "## Using the CLI"; blank and comment-only
# lines skipped, lines ending in a backslash joined to the next.
mapfile -t tour < <(awk '
  /^## Using the CLI/ { section = 1; next }
  section && /^## / { exit }
  section && !inblock && /^```sh/ { inblock = 1; next }
  inblock && /^```/ { exit }
  inblock {
    if (sub(/\\$/, "")) { pending = pending $0; next }
    line = pending $0; pending = ""
    if (line ~ /^[[:space:]]*(#|$)/) next
    print line
  }' "$readme")
((${#tour[@]})) || fail "no commands found under '## Using the CLI' in $readme"
# The curl example written beside the block (optional): `curl ...127.0.0.1:8080...`
curl_example=$(awk '/^## Using the CLI/ { s = 1; next } s && /^## / { exit }
  s && match($0, /`curl [^`]*`/) { print substr($0, RSTART + 1, RLENGTH - 2); exit }' "$readme")

# Every `build/bin/flashdllm` (not part of a longer path) becomes this checkout's binary.
qbin=$(printf '%q' "$bin")
retarget() {
  sed -E "s#(^|[^[:alnum:]_./-])build/bin/flashdllm#\\1${qbin//#/\\#}#g" <<<"$1"
}

export TMPDIR="$work"  # where the tour's temp outputs (make-model) go; removed at exit
n=0
run_one() {  # $1 = the README line
  local line=$1 cmd rc t0 t1
  cmd=$(retarget "$line")
  t0=$EPOCHREALTIME
  set +e
  timeout --kill-after=5 "$timeout_s" bash -c "$cmd" >"$work/out" 2>"$work/err" </dev/null
  rc=$?
  set -e
  t1=$EPOCHREALTIME
  if [ "$rc" -ne 0 ]; then
    [ "$rc" -eq 124 ] && echo "check_tour: timed out after ${timeout_s}s" >&2
    show "$work/out" stdout; show "$work/err" stderr
    fail "exit $rc: $line"
  fi
  if [[ "$line" == *" --json"* ]] &&
     ! python3 -c 'import json, sys; json.load(sys.stdin)' <"$work/out" 2>/dev/null; then
    show "$work/out" stdout
    fail "output is not one JSON object: $line"
  fi
  printf 'ok   %5.2fs  %s\n' "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" "$line"
}

# GET /health, POST /v1/completions on 127.0.0.1:PORT (no proxy); PORT = argv[1]
cat >"$work/query.py" <<'PY'
import json, sys, urllib.request
base = f"http://127.0.0.1:{sys.argv[1]}"
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
with opener.open(base + "/health", timeout=30) as r:
    health = json.load(r)
assert health.get("status") == "ok", f"/health: {health}"
req = urllib.request.Request(
    base + "/v1/completions",
    data=json.dumps({"prompt": "Once upon a time", "max_tokens": 16, "temperature": 0}).encode(),
    headers={"Content-Type": "application/json"})
with opener.open(req, timeout=30) as r:
    body = json.load(r)
text = body["choices"][0]["text"]
assert body["usage"]["completion_tokens"] > 0 and text, f"/v1/completions: {body}"
print(f"/health ok, /v1/completions -> {text[:40]!r}")
PY

run_serve() {  # $1 = the README line: start on loopback, any free port, query, stop
  local line=$1 cmd port=""
  cmd=$(retarget "$line")
  cmd=$(sed -E 's/[[:space:]]+#.*$//' <<<"$cmd")        # drop the comment
  if grep -qE -- '--host([[:space:]=]|$)' <<<"$cmd" &&
     ! grep -qE -- '--host[[:space:]=]+(127\.0\.0\.1|localhost)([[:space:]]|$)' <<<"$cmd"; then
    fail "serve must bind loopback only in this check: $line"
  fi
  grep -qE -- '--port[[:space:]=]+[0-9]+' <<<"$cmd" || fail "serve line has no --port: $line"
  cmd=$(sed -E 's/--port[[:space:]=]+[0-9]+/--port 0/' <<<"$cmd")
  cmd="$cmd --host 127.0.0.1"
  bash -c "exec $cmd" >"$work/serve.out" 2>"$work/serve.err" </dev/null &
  server_pid=$!
  for _ in $(seq 300); do   # up to 30 s for "flashdllm: listening on http://HOST:PORT"
    port=$(sed -nE 's#^flashdllm: listening on http://127\.0\.0\.1:([0-9]+)$#\1#p' "$work/serve.err")
    [ -n "$port" ] && break
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.1
  done
  if [ -z "$port" ]; then
    show "$work/serve.err" "server stderr"
    fail "server did not start listening on 127.0.0.1: $line"
  fi
  local answer
  if ! answer=$(timeout "$timeout_s" python3 "$work/query.py" "$port" 2>&1); then
    echo "$answer" >&2; show "$work/serve.err" "server stderr"
    fail "server did not answer: $line"
  fi
  if [ -n "$curl_example" ] && command -v curl >/dev/null; then
    local c="${curl_example//127.0.0.1:8080/127.0.0.1:$port}"
    c="${c//localhost:8080/127.0.0.1:$port}"
    [[ "$c" == *"127.0.0.1:$port"* ]] || fail "the README's curl example does not use 127.0.0.1:8080: $curl_example"
    if ! timeout "$timeout_s" env -u http_proxy -u HTTP_PROXY -u all_proxy -u ALL_PROXY \
         bash -c "$c" >"$work/curl.out" 2>&1 ||
       ! python3 -c 'import json, sys; assert json.load(sys.stdin)["choices"][0]["text"]' \
         <"$work/curl.out" 2>/dev/null; then
      show "$work/curl.out" "curl output"
      fail "the README's curl example failed against the server: $curl_example"
    fi
    answer="$answer; curl example ok"
  fi
  kill -TERM "$server_pid"
  local rc=0
  for _ in $(seq 100); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$server_pid" 2>/dev/null && fail "server did not stop within 10 s of SIGTERM: $line"
  wait "$server_pid" || rc=$?
  server_pid=""
  [ "$rc" -eq 0 ] || { show "$work/serve.err" "server stderr"; fail "server exited $rc after SIGTERM: $line"; }
  printf 'ok   (port %s: %s)  %s\n' "$port" "$answer" "$line"
}

echo "check_tour: ${#tour[@]} commands from $readme, binary $bin"
for line in "${tour[@]}"; do
  n=$((n + 1))
  if grep -qE '(^|[[:space:];&|])build/bin/flashdllm[[:space:]]+serve([[:space:]]|$)' <<<"$line"; then
    run_serve "$line"
  else
    run_one "$line"
  fi
done
echo "check_tour: all $n commands passed"
