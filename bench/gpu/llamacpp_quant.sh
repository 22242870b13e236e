#!/usr/bin/env bash
# Runs on the GPU machine: flashdllm and llama.cpp CUDA on the same block-quantized files in one
# run. Builds llama.cpp (sm_90, flash attention) from a source tarball, writes the Llama-3-8B
# shape in F16 with random weights (flashdllm tools make-model), quantizes it with llama.cpp's
# own llama-quantize, then times, per type:
#   flashdllm: bench_gpu (prompt 512, batches 1 and 64);
#   llama.cpp: llama-bench (pp512, tg128, batch 1) and llama-batched-bench (512-token prompts,
#              128 new tokens, 1 and 64 sequences).
# flashdllm runs first: the llama.cpp build takes 4-6 minutes of a call's 10, and a call cut
# short should still have flashdllm's side.
# Env: LLAMA_TAR (tarball holding llama.cpp/), FDL_BIN (bench_gpu, flashdllm), OUT (results),
#      TYPES (default "Q4_K_M Q8_0"), PRESET (default llama3-8b), REPS (default 3).
set -uo pipefail
OUT=${OUT:-/tmp/fdl-out}
TYPES=${TYPES:-Q4_K_M Q8_0}
PRESET=${PRESET:-llama3-8b}
REPS=${REPS:-3}
mkdir -p "$OUT"
log() { echo "[$(date +%T)] $*"; }
failed=""

LB=/tmp/llama-build/bin
if [ ! -x "$LB/llama-batched-bench" ]; then  # a build left by an earlier step of the same call is reused
  log "building llama.cpp"
  rm -rf /tmp/llama.cpp /tmp/llama-build
  tar xJf "$LLAMA_TAR" -C /tmp || exit 1
  cmake -S /tmp/llama.cpp -B /tmp/llama-build -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    >"$OUT/llama_cmake.txt" 2>&1 || { tail -20 "$OUT/llama_cmake.txt"; exit 1; }
  cmake --build /tmp/llama-build -j "$(nproc)" --target llama-bench llama-quantize llama-batched-bench \
    >"$OUT/llama_build.txt" 2>&1 || { tail -30 "$OUT/llama_build.txt"; exit 1; }
  log "llama.cpp built"
fi

F16=/tmp/$PRESET-f16.gguf
timeout 120 "$FDL_BIN/flashdllm" tools make-model --preset "$PRESET" --dtype f16 -o "$F16" | tail -1
for T in $TYPES; do
  M=/tmp/$PRESET-$T.gguf
  log "llama-quantize $T"
  timeout 300 "$LB/llama-quantize" "$F16" "$M" "$T" "$(nproc)" >"$OUT/quantize_$T.txt" 2>&1 || { failed="$failed quantize-$T"; continue; }
  ls -l "$M"
  log "flashdllm bench_gpu $T"
  timeout 240 "$FDL_BIN/bench_gpu" -m "$M" --prompt 512 --gen 128 --batches 1,64 --reps "$REPS" --batch-invariant off \
    --json "$OUT/bench_$T.json" >"$OUT/bench_$T.txt" 2>&1 || failed="$failed bench_gpu-$T"
  grep -E "^model|^copy|^batch" "$OUT/bench_$T.txt"
  log "llama-bench $T"
  timeout 240 "$LB/llama-bench" -m "$M" -ngl 99 -fa 1 -p 512 -n 128 -r "$REPS" -o md >"$OUT/llama_bench_$T.md" 2>&1 ||
    failed="$failed llama-bench-$T"
  cat "$OUT/llama_bench_$T.md"
  log "llama-batched-bench $T"
  timeout 240 "$LB/llama-batched-bench" -m "$M" -ngl 99 -fa on -c 41984 -b 2048 -ub 512 -npp 512 -ntg 128 -npl 1,64 \
    >"$OUT/llama_batched_$T.txt" 2>&1 || failed="$failed llama-batched-bench-$T"
  grep -E "^\|" "$OUT/llama_batched_$T.txt"
  rm -f "$M"
done
rm -f "$F16"
[ -z "$failed" ] || { echo "failed:$failed"; exit 1; }
