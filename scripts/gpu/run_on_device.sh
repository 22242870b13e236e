#!/usr/bin/env bash
# Runs on the GPU machine (builds nothing): GPU tests, then the Llama-3-8B-shape benchmark of
# flashdllm and the HF Transformers peer in the same run. Expects .device/ from stage.sh.
# Results go to $OUT (or /tmp/fdl-out): gpu_tests.xml, bench.json, hf.json, log.txt.
#   STEPS="tests smoke refs bench sweep hf" (default: tests bench hf; smoke = scripts/gpu/smoke_cli.sh; refs =
#   scripts/greedy_refs.py, cuda vs cpu on every reference prompt); BATCHES=1,64; PROMPT=512; GEN=128;
#   REPS=3; BATCH_INVARIANT=off (the kernels docs/BENCHMARKS.md's decode tables measure; on: the
#   invariant ones); BENCH_FLAGS (extra bench_gpu flags, e.g. --sampling); HF_MODES=dynamic,static; NOGRAPH=1 adds a batch-1 run without CUDA graphs;
#   SWEEP_GEMV="16,1 4,1 4,2" adds GEMV variants to the sweep; SWEEP_LITE=1 keeps only the profile
#   AB="tc nofuse profile" adds batch-1 runs with FLASHDLLM_ATTN_TC=1 / FLASHDLLM_CUDA_FUSE=0 /
#   FLASHDLLM_CUDA_PROFILE=1; ABENV="VAR=VALUE[,VAR=VALUE]:BATCHES ..." adds one bench run per entry
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/fdl-out}
mkdir -p "$OUT"
source scripts/gpu/device_env.sh
export FLASHDLLM_SHARED=$D/shared
export FLASHDLLM_TEST_DATA=$PWD/tests/data  # the working tree travels; the build's source path does not
STEPS=${STEPS:-tests bench hf}
MODEL=${MODEL:-/tmp/l3-8b-bf16.gguf}
log() { echo "[$(date +%T)] $*"; }
failed=""  # steps that failed: the exit status is non-zero when any did
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader

if [[ $STEPS == *tests* ]]; then
  log "GPU tests"
  # The opt-in tensor-core path runs in a process of its own: a fault there (a sticky CUDA
  # error) must not fail the default path's tests.
  # The suites' own exit status decides (a pipe would report the last filter's).
  timeout ${TEST_TIMEOUT:-150} "$D/bin/test_gpu" --gtest_filter='-*TensorCore*' --gtest_output=xml:"$OUT/gpu_tests.xml" \
    >"$OUT/tests.txt" 2>&1 || { failed="$failed test_gpu"; }
  grep -E "FAILED|PASSED|seed|ids equal|Failure|Expected|Which is|rel_error|error" "$OUT/tests.txt" | head -80
  timeout 60 "$D/bin/test_gpu" --gtest_filter='*TensorCore*' --gtest_output=xml:"$OUT/gpu_tests_tc.xml" \
    >"$OUT/tests_tc.txt" 2>&1 || { failed="$failed test_gpu(TensorCore)"; }
  grep -E "FAILED|PASSED|seed|rel error|Failure|Expected|Which is|error" "$OUT/tests_tc.txt" | head -30
fi
if [[ $STEPS == *smoke* ]]; then  # the CLI and the server with --device cuda, end to end
  log "CLI and server smoke test"
  timeout ${SMOKE_TIMEOUT:-180} bash scripts/gpu/smoke_cli.sh >"$OUT/smoke.txt" 2>&1 || failed="$failed smoke"
  grep -E "^(ok|FAIL|multiturn)" "$OUT/smoke.txt"
fi
if [[ $STEPS == *refs* ]]; then  # greedy ids of every reference prompt: cuda against cpu, whole length
  log "greedy ids of every reference prompt, cuda vs cpu"
  for dev in cpu cuda; do
    timeout 200 python3 scripts/greedy_refs.py --flashdllm "$D/bin/flashdllm" --device $dev -o "$OUT/refs_$dev.jsonl"
  done
  python3 scripts/greedy_refs.py --compare "$OUT/refs_cpu.jsonl" "$OUT/refs_cuda.jsonl" >"$OUT/refs.txt" || failed="$failed refs"
  tail -1 "$OUT/refs.txt"
fi
if [[ $STEPS == *bench* ]]; then
  if [ ! -f "$MODEL" ]; then
    log "making $MODEL (Llama-3-8B shape, BF16, random weights)"
    timeout 240 "$D/bin/flashdllm" tools make-model --preset llama3-8b --dtype bf16 -o "$MODEL" | tail -2
  fi
  log "flashdllm bench"
  timeout ${BENCH_TIMEOUT:-240} "$D/bin/bench_gpu" -m "$MODEL" --prompt ${PROMPT:-512} --gen ${GEN:-128} \
    --batches ${BATCHES:-1,64} --reps ${REPS:-3} --batch-invariant ${BATCH_INVARIANT:-off} ${BENCH_FLAGS:-} \
    --json "$OUT/bench.json" || failed="$failed bench"
  B1X="timeout ${AB_TIMEOUT:-60} $D/bin/bench_gpu -m $MODEL --prompt ${PROMPT:-512} --gen ${GEN:-128} --batches 1 --reps 2 --batch-invariant ${BATCH_INVARIANT:-off}"
  if [[ ${AB:-} == *tc* ]]; then    # prefill attention on tensor cores (opt-in path)
    log "flashdllm bench, FLASHDLLM_ATTN_TC=1 (batch 1)"
    FLASHDLLM_ATTN_TC=1 $B1X --json "$OUT/bench_tc.json"
  fi
  if [[ ${AB:-} == *nofuse* ]]; then  # decode without the fused norm/RoPE/SwiGLU projections
    log "flashdllm bench, FLASHDLLM_CUDA_FUSE=0 (batch 1)"
    FLASHDLLM_CUDA_FUSE=0 $B1X --json "$OUT/bench_nofuse.json"
  fi
  if [[ ${AB:-} == *profile* ]]; then  # per-op device time (graphs off)
    log "flashdllm per-op profile (batch 1)"
    FLASHDLLM_CUDA_PROFILE=1 $B1X | grep -E "profile|batch"
  fi
  # ABENV="VAR=VALUE[,VAR=VALUE]:BATCHES ...": one A/B bench run per entry, e.g.
  # FLASHDLLM_GEMM_TUNE=0:64 or FLASHDLLM_ATTN_LANES=8,FLASHDLLM_GEMV_PER_SM=3:1
  for ab in ${ABENV:-}; do
    log "flashdllm bench, ${ab%%:*} (batches ${ab##*:})"
    # shellcheck disable=SC2046 # one word per VAR=VALUE
    env $(tr ',' ' ' <<<"${ab%%:*}") timeout ${AB_TIMEOUT:-60} "$D/bin/bench_gpu" -m "$MODEL" --prompt ${PROMPT:-512} --gen ${GEN:-128} \
      --batches "${ab##*:}" --reps 2 | grep batch
  done
  if [ -n "${NOGRAPH:-}" ]; then
    log "flashdllm bench without CUDA graphs (batches ${NOGRAPH_BATCHES:-1})"
    FLASHDLLM_CUDA_GRAPHS=0 timeout 120 "$D/bin/bench_gpu" -m "$MODEL" --prompt ${PROMPT:-512} --gen ${GEN:-128} \
      --batches ${NOGRAPH_BATCHES:-1} --reps 2 --json "$OUT/bench_nograph.json" || failed="$failed bench(no graphs)"
  fi
fi
if [[ $STEPS == *sweep* ]]; then  # tuning: PDL off, GEMV variants, per-op profile
  B1="timeout 90 $D/bin/bench_gpu -m $MODEL --prompt ${PROMPT:-512} --gen ${GEN:-128} --reps 2"
  if [ -z "${SWEEP_LITE:-}" ]; then
    log "no PDL";            FLASHDLLM_PDL=0 $B1 --batches 1 | grep batch
    log "no graphs";         FLASHDLLM_CUDA_GRAPHS=0 $B1 --batches 1 | grep batch
    log "no tiled prefill";  FLASHDLLM_ATTN_TILES=0 $B1 --batches 1 | grep batch
  fi
  for v in ${SWEEP_GEMV:-}; do
    log "GEMV $v";         FLASHDLLM_GEMV=$v $B1 --batches 1 | grep batch
  done
  log "profile";           FLASHDLLM_CUDA_PROFILE=1 $B1 --batches 1,64 | grep -E "profile|batch"
fi
if [[ $STEPS == *hf* ]]; then
  log "HF Transformers peer"
  PYTHONUNBUFFERED=1 timeout ${HF_TIMEOUT:-300} python3 "$D/bench/hf_peer.py" --prompt ${PROMPT:-512} \
    --gen ${GEN:-128} --batches ${BATCHES:-1,64} --modes ${HF_MODES:-dynamic,static} --json "$OUT/hf.json" ||
    failed="$failed hf"
fi
log "done"
if [ -n "$failed" ]; then
  echo "FAILED:$failed" >&2
  exit 1
fi
