#!/usr/bin/env bash
# What a user runs with --device "$DEV", end to end, on the GPU machine (after stage.sh; no
# build there): generate (greedy ids equal the CPU's; sampling and speculation run), the
# multi-turn engine with KV tiers 1 and 2 (same final contexts as recompute-only), and the
# OpenAI-compatible server (completion, streamed chat) on loopback. Prints "ok"/"FAIL" lines
# and exits non-zero on any failure.
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/device_env.sh
F=$D/bin/flashdllm
DEV=${DEV:-cuda}  # DEV=cpu checks the script itself on a machine without a GPU
M=$D/shared/models
fail=0
check() {  # check NAME GOT WANT
  if [ "$2" = "$3" ]; then echo "ok   $1"; else echo "FAIL $1: got '$2', want '$3'"; fail=1; fi
}
ids() { python3 -c "import json,sys; print(json.load(sys.stdin)['token_ids'])"; }
field() { python3 -c "import json,sys; d=json.load(sys.stdin); print(d$1)"; }

for model in stories260K.gguf codelm-16m-f16.gguf; do
  p="Once upon a time"; [ "$model" = codelm-16m-f16.gguf ] && p="def fibonacci(n):"
  cpu=$($F generate -m "$M/$model" -p "$p" -n 48 --temp 0 --ignore-eos --json --device cpu 2>/dev/null | ids)
  gpu=$($F generate -m "$M/$model" -p "$p" -n 48 --temp 0 --ignore-eos --json --device "$DEV" 2>/dev/null | ids)
  check "generate greedy $model: cuda ids == cpu ids" "$gpu" "$cpu"
  spec=$($F generate -m "$M/$model" -p "$p" -n 48 --temp 0 --ignore-eos --json --device "$DEV" --spec lookup 2>/dev/null | ids)
  check "generate --spec lookup $model on cuda == plain" "$spec" "$gpu"
  n=$($F generate -m "$M/$model" -p "$p" -n 32 --temp 0.8 --top-p 0.9 --seed 3 --ignore-eos --json --device "$DEV" \
      2>/dev/null | python3 -c "import json,sys; print(len(json.load(sys.stdin)['token_ids']))")
  check "generate sampling $model on cuda: 32 tokens" "$n" "32"
done

# Multi-turn sessions through a small tier 0: recompute-only vs host + disk tiers. stories260K
# is F32 (fp32 GEMV and SGEMM, no 16-bit rounding), so recomputing a prefix in other chunks
# gives the same greedy ids and the two placements must end with the same contexts.
mt() {  # mt SESSIONS TURNS [flags]
  $F multiturn -m "$M/stories260K.gguf" --device "$DEV" --sessions "$1" --turns "$2" --first-tokens 100 \
     --message-tokens 16 --answer-tokens 16 --max-num-seqs 2 "${@:3}" 2>/dev/null
}
bb=$(mt 1 1 | field "['block_bytes']")
rec=$(mt 8 3 --kv-tier0-bytes $((40 * bb)) --kv-placement recompute)
dir=$(mktemp -d)
tier=$(mt 8 3 --kv-tier0-bytes $((40 * bb)) --kv-placement disk --kv-host-bytes $((16 * bb)) --kv-disk-path "$dir" \
          --kv-disk-bytes $((256 * bb)))
rm -rf "$dir"
echo "multiturn recompute: $(echo "$rec" | field "['total_ms']") ms; tiers: $(echo "$tier" | field "['kv_tiers']['promoted']") promoted, $(echo "$tier" | field "['kv_tiers']['demoted_host']") to host, $(echo "$tier" | field "['kv_tiers']['demoted_disk']") to disk, $(echo "$tier" | field "['total_ms']") ms"
check "multiturn on cuda: tiers moved blocks back" "$(echo "$tier" | field "['kv_tiers']['promoted'] > 0")" "True"
check "multiturn on cuda: tiers == recompute (final contexts)" "$(echo "$tier" | field "['context_digest']")" \
      "$(echo "$rec" | field "['context_digest']")"

# The server on loopback.
log=$(mktemp)
$F serve -m "$M/codelm-16m-f16.gguf" --device "$DEV" --chat-template chatml --host 127.0.0.1 --port 0 2>"$log" &
pid=$!
port=""
for _ in $(seq 100); do
  port=$(grep -o 'listening on http://127.0.0.1:[0-9]*' "$log" | grep -o '[0-9]*$' || true)
  [ -n "$port" ] && break
  sleep 0.2
done
if [ -z "$port" ]; then echo "FAIL serve did not start:"; cat "$log"; fail=1; else
  out=$(python3 - "$port" <<'PY'
import json, sys, urllib.request
port = sys.argv[1]
def post(path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=60).read().decode()
c = json.loads(post("/v1/completions", {"prompt": "def add(a, b):", "max_tokens": 24, "temperature": 0}))
s = post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Write a loop"}],
                                  "max_tokens": 16, "stream": True})
chunks = [l for l in s.splitlines() if l.startswith("data: ") and l != "data: [DONE]"]
print(c["usage"]["completion_tokens"], len(chunks) > 1, s.strip().endswith("data: [DONE]"))
PY
)
  check "serve --device "$DEV": completion tokens, streamed chunks, [DONE]" "$out" "24 True True"
fi
kill $pid 2>/dev/null; wait $pid 2>/dev/null
exit $fail
