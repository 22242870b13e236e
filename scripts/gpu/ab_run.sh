#!/usr/bin/env bash
# Runs on the GPU machine: the bench_gpu binaries staged by ab_stage.sh, alternated ROUNDS
# times (batch-1 greedy decode, prompt 512, 128 new tokens, 2 repetitions each), then one
# `--trace` run of each (docs/GPU.md: where a layer's time goes). Makes the Llama-3-8B-shape
# BF16 model first if it is not there. Prints one line per run.
#   ROUNDS=3 BATCHES=1 TRACE=1 bash scripts/gpu/ab_run.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH=$PWD/.device/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
AB=.device/ab
MODEL=${MODEL:-/tmp/l3-8b-bf16.gguf}
[ -f "$MODEL" ] || timeout 240 "$AB/flashdllm" tools make-model --preset llama3-8b --dtype bf16 -o "$MODEL" | tail -1
mapfile -t names < <(cut -d: -f1 "$AB/REFS")
cat "$AB/REFS"
for r in $(seq 1 "${ROUNDS:-3}"); do
  for n in "${names[@]}"; do
    echo "== $n round $r: $(timeout 90 "$AB/$n" -m "$MODEL" --batches "${BATCHES:-1}" --reps 2 2>&1 | grep -E '^batch' | head -1)"
  done
done
if [ "${TRACE:-1}" = 1 ]; then
  for n in "${names[@]}"; do
    echo "== trace $n"
    timeout 90 "$AB/$n" -m "$MODEL" --batches 1 --reps 1 --trace 2>&1 | grep -E "trace|^ +[a-z]"
  done
fi
