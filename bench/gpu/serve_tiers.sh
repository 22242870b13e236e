#!/usr/bin/env bash
# The KV-tier serving benchmark on the GPU machine (after scripts/gpu/stage.sh): `flashdllm
# serve --device cuda` on loopback with the Llama-3-8B shape (F16, random weights) and a
# 2500 MiB tier 0, driven by bench/serve_sessions.py (multi-turn sessions arriving as a
# Poisson process, shared system prompt, think time, 1-4k-token first prompts), once per
# placement in one call: auto (tier 1 12 GiB), recompute-only, host-only.
# One JSON per placement in $OUT/serve_<placement>.json and a table on stdout.
# The default load (32 sessions at 1/s, 4 s mean think time) keeps ~25 sessions of ~3k tokens
# open at once: 4-5x what tier 0 holds, so returning turns find their prefix in tier 1 or
# recompute it, as on a busy chat server.
# BATCH_INVARIANT (default off: the kernels of docs/BENCHMARKS.md's table) is passed as --batch-invariant.
#   PLACEMENTS="auto recompute host" SESSIONS=32 RATE=1 THINK=4 TURNS=4-8 MODEL=/tmp/l3-8b-f16.gguf
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/gpu/bench_env.sh || exit 1
for placement in ${PLACEMENTS:-auto recompute host}; do
  slog=$OUT/serve_$placement.log
  host=(--kv-host-bytes 12GiB)
  "$F" serve -m "$MODEL" --device cuda -c 8192 --max-num-seqs 8 --kv-tier0-bytes 2500MiB "${host[@]}" \
    --batch-invariant "${BATCH_INVARIANT:-off}" \
    --kv-placement "$placement" --host 127.0.0.1 --port 0 2>"$slog" &
  pid=$!
  port=""
  for _ in $(seq 300); do
    port=$(grep -o 'listening on http://127.0.0.1:[0-9]*' "$slog" | grep -o '[0-9]*$' || true)
    [ -n "$port" ] && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.2
  done
  if [ -z "$port" ]; then
    echo "FAIL serve ($placement) did not start:"; tail -5 "$slog"; kill $pid 2>/dev/null; continue
  fi
  log "serve $placement on port $port"
  timeout ${RUN_TIMEOUT:-200} python3 bench/serve_sessions.py --url "http://127.0.0.1:$port/v1" \
    --sessions "${SESSIONS:-32}" --rate "${RATE:-1}" --turns "${TURNS:-4-8}" --first-tokens 1000-4000 \
    --system-tokens 256 --message-tokens 64 --answer-tokens 32 --think-s "${THINK:-4}" --vocab 32000 \
    --seed 1 --json "$OUT/serve_$placement.json"
  curl -s "http://127.0.0.1:$port/metrics" | grep -E "^flashdllm_kv_(copy|link|cache_blocks|blocks_moved_total\{from=\"(device|host)\",to=\"(device|host)\")" \
    >"$OUT/serve_${placement}_metrics.txt"
  kill -TERM $pid; wait $pid 2>/dev/null
done
python3 - "$OUT" <<'EOF'
import json, os, sys
out = sys.argv[1]
rows = {}
for p in ("auto", "recompute", "host"):
    f = os.path.join(out, f"serve_{p}.json")
    if os.path.exists(f):
        rows[p] = json.load(open(f))
print(f"{'placement':10} {'reqs':>5} {'err':>4} {'TTFT first p50/p95':>20} {'returning p50/p95':>20} {'ITL p50/p95/sd':>20} {'out tok/s':>9}")
for p, s in rows.items():
    print(f"{p:10} {s['requests']:5} {s['n_errors']:4} {s['ttft_first_ms']['p50']:9.0f}/{s['ttft_first_ms']['p95']:<9.0f} "
          f"{s['ttft_returning_ms']['p50']:9.0f}/{s['ttft_returning_ms']['p95']:<9.0f} "
          f"{s['itl_ms']['p50']:6.2f}/{s['itl_ms']['p95']:6.2f}/{s['itl_ms']['stddev']:5.2f} {s['output_tok_per_s']:9.0f}")
if "auto" in rows and "recompute" in rows:
    a, r = rows["auto"], rows["recompute"]
    print(f"returning p95 TTFT recompute/auto: {r['ttft_returning_ms']['p95'] / max(a['ttft_returning_ms']['p95'], 1e-9):.2f}x; "
          f"output tok/s auto/recompute {a['output_tok_per_s'] / max(r['output_tok_per_s'], 1e-9):.2f}x; "
          f"ITL sd auto/recompute {a['itl_ms']['stddev'] / max(r['itl_ms']['stddev'], 1e-9):.2f}x")
EOF
