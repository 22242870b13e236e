#!/usr/bin/env bash
# End-to-end A/B of async scheduling on the GPU machine (expects .device/ from stage.sh):
# `flashdllm generate --device cuda` greedy, alternating the default (async scheduling) with
# --no-async-scheduling, ROUNDS times per model; prints each run's decode tok/s (the
# engine's GenerationTimings: tokens after the first over the decode time) and the medians.
#   ROUNDS=5 N=256 MODELS="codelm-16m-f16 stories260K" bash scripts/gpu/async_ab.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
D=$PWD/.device
export LD_LIBRARY_PATH=$D/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
ROUNDS=${ROUNDS:-5}
N=${N:-256}
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
for model in ${MODELS:-codelm-16m-f16 stories260K}; do
  declare -A runs=()
  for r in $(seq "$ROUNDS"); do
    for variant in async sync; do
      flag=()
      [ "$variant" = sync ] && flag=(--no-async-scheduling)
      tps=$(timeout 60 "$D/bin/flashdllm" generate -m "$D/shared/models/$model.gguf" --device cuda -p "Once upon a time" \
        -n "$N" --temp 0 --ignore-eos --json "${flag[@]}" 2>/dev/null |
        python3 -c 'import json, sys; print(round(json.load(sys.stdin)["timings"]["decode_tok_s"], 1))')
      echo "$model $variant round $r: ${tps:-failed} tok/s"
      runs[$variant]+="${tps:-0} "
    done
  done
  a=$(tr ' ' '\n' <<<"${runs[async]}" | grep . | median)
  s=$(tr ' ' '\n' <<<"${runs[sync]}" | grep . | median)
  echo "$model: async ${a} tok/s, sync ${s} tok/s (medians of $ROUNDS)"
  unset runs
done
