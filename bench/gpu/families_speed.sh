#!/usr/bin/env bash
# Batch-1 decode of each family's 8B-class shape against its own bandwidth roofline, in one run
# (run on the GPU machine from the repository root, after scripts/gpu/stage.sh): random BF16
# weights written by `flashdllm tools make-model` for the llama3-8b, qwen2-7b, qwen3-8b and gemma2-9b
# presets, each timed by bench_gpu (prompt 512, 128 new tokens, batch 1 and 64, 3 repetitions)
# and deleted before the next is made (three 8B files do not fit the disk at once). Prints
# bench_gpu's roofline line and its batch lines per family; JSON per family in $OUT.
# BATCH_INVARIANT (default off: the kernels of docs/BENCHMARKS.md's table) is passed as --batch-invariant.
#   PRESETS="llama3-8b qwen2-7b qwen3-8b gemma2-9b" BATCHES=1,64 bash bench/gpu/families_speed.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/fdl-out}
mkdir -p "$OUT"
source scripts/gpu/device_env.sh
F=$D/bin/flashdllm
status=0
for preset in ${PRESETS:-llama3-8b qwen2-7b qwen3-8b gemma2-9b}; do
  model=/tmp/family-$preset-bf16.gguf
  echo "== $preset"
  timeout 300 "$F" tools make-model --preset "$preset" --dtype bf16 -o "$model" | tail -1 || { status=1; continue; }
  timeout 240 "$D/bin/bench_gpu" -m "$model" --batches "${BATCHES:-1,64}" --reps 3 --batch-invariant "${BATCH_INVARIANT:-off}" \
    --json "$OUT/families-$preset.json" \
    2>&1 | grep -E "roofline|^batch" || status=1
  rm -f "$model"
done
exit $status
