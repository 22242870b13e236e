#!/usr/bin/env bash
# The KV-tier benchmark on the GPU machine (after scripts/gpu/stage.sh; builds nothing): 32
# multi-turn sessions of the Llama-3-8B shape (F16, random weights, KV in f16 = 128 KiB per
# token, 2 MiB blocks) through a 2500 MiB tier 0, in one call, for every placement:
#   roomy      tier 0 large enough to need no tiers (the ITL baseline)
#   recompute  evicted blocks dropped and recomputed
#   host       forced to tier 1 (12 GiB)
#   auto       the cost rule, tier 1 12 GiB + tier 2 20 GiB
#   auto-2g    the cost rule, tier 1 2 GiB + tier 2 20 GiB
# One JSON line per run in $OUT/multiturn.jsonl (`flashdllm multiturn`'s output plus "run");
# a table on stdout. The link's bandwidth (one large page-locked transfer each way) is measured
# by each run's tier manager at start-up and reported beside the live copy rates.
# TRACE names the runs that also write a Chrome trace ($OUT/trace_<run>.json; default: auto).
# BATCH_INVARIANT (on|off, default off: the kernels of docs/BENCHMARKS.md's table) is passed
# as --batch-invariant.
#   RUNS="roomy recompute host auto auto-2g" TRACE="auto" SESSIONS=32 TURNS=4 MODEL=/tmp/l3-8b-f16.gguf
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/gpu/bench_env.sh || exit 1
RUNS=${RUNS:-roomy recompute host auto auto-2g}
DISK=$(mktemp -d /tmp/fdl-kv-disk.XXXX)
common=(-m "$MODEL" --device cuda --sessions "${SESSIONS:-32}" --turns "${TURNS:-4}" --first-tokens 2048
        --message-tokens 64 --answer-tokens 32 --max-num-seqs 4 --batch-invariant "${BATCH_INVARIANT:-off}")
: >"$OUT/multiturn.jsonl"
for run in $RUNS; do
  case $run in
    roomy) flags=(--kv-tier0-bytes 40GiB --kv-placement recompute) ;;
    recompute) flags=(--kv-tier0-bytes 2500MiB --kv-host-bytes 12GiB --kv-placement recompute) ;;
    host) flags=(--kv-tier0-bytes 2500MiB --kv-host-bytes 12GiB --kv-placement host) ;;
    auto) flags=(--kv-tier0-bytes 2500MiB --kv-host-bytes 12GiB --kv-disk-path "$DISK" --kv-disk-bytes 20GiB
                 --kv-placement auto) ;;
    auto-2g) flags=(--kv-tier0-bytes 2500MiB --kv-host-bytes 2GiB --kv-disk-path "$DISK" --kv-disk-bytes 20GiB
                    --kv-placement auto) ;;
    *) echo "unknown run $run" >&2; exit 2 ;;
  esac
  log "multiturn $run"
  trace=()
  [[ " ${TRACE-auto} " == *" $run "* ]] && trace=(--trace "$OUT/trace_$run.json")
  timeout ${RUN_TIMEOUT:-150} "$F" multiturn "${common[@]}" "${flags[@]}" "${trace[@]}" 2>"$OUT/multiturn_$run.log" |
    python3 -c "import json,sys; d=json.loads(sys.stdin.read()); d['run']='$run'; print(json.dumps(d))" \
    >>"$OUT/multiturn.jsonl" || { echo "FAIL $run"; tail -5 "$OUT/multiturn_$run.log"; }
done
rm -rf "$DISK"
python3 - "$OUT/multiturn.jsonl" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = {r["run"]: r for r in rows}
print(f"{'run':10} {'total s':>8} {'ret TTFT mean/p95 ms':>22} {'ITL p50/p95/sd ms':>20} {'cached':>6} "
      f"{'dem/drop/prom':>18} {'copy GB/s d2h/h2d':>18} {'link':>12} {'wait max ms':>11} digest")
for r in rows:
    k = r["kv_tiers"]; t = k.get("tiers", {}); dc = t.get("device_copies", {})
    g = dc.get("gbps", {}); l = dc.get("link_gbps", {})
    print(f"{r['run']:10} {r['total_ms']/1e3:8.2f} {r['ttft_returning_ms']['mean']:10.1f}/{r['ttft_returning_ms']['p95']:<10.1f} "
          f"{r['itl_ms']['p50']:6.2f}/{r['itl_ms']['p95']:6.2f}/{r['itl_ms']['stddev']:5.2f} "
          f"{r['returning_cached_fraction']:6.2f} {k['demoted_host']+k['demoted_disk']:6}/{k['dropped']:5}/{k['promoted']:5} "
          f"{g.get('d2h',0):8.1f}/{g.get('h2d',0):<8.1f} {l.get('d2h',0):5.1f}/{l.get('h2d',0):<5.1f} "
          f"{k.get('copy_wait_ms_max',0):11.2f} {r['context_digest']}")
if "recompute" in by:
    rc = by["recompute"]
    for name in ("auto", "host", "auto-2g"):
        if name in by:
            r = by[name]
            print(f"{name} / recompute: total {r['total_ms']/rc['total_ms']:.2f}x, returning TTFT mean "
                  f"{r['ttft_returning_ms']['mean']/rc['ttft_returning_ms']['mean']:.2f}x, p95 "
                  f"{r['ttft_returning_ms']['p95']/rc['ttft_returning_ms']['p95']:.2f}x")
if "roomy" in by:
    for name in ("auto", "host"):
        if name in by:
            print(f"{name} ITL p95 / roomy: {by[name]['itl_ms']['p95']/by['roomy']['itl_ms']['p95']:.2f}x")
EOF
