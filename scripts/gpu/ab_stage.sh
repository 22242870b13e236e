#!/usr/bin/env bash
# Stages bench_gpu binaries built from several git refs into .device/ab/ (ignored by git; carry
# [".device/ab", ".device/lib"] with the `run` tool), plus flashdllm (to make the model there)
# and the shared libraries the GPU image lacks. Then `bash scripts/gpu/ab_run.sh` on the GPU
# machine alternates them in one call: the way every kernel change of docs/GPU.md's tuning log
# is measured, since machines differ by ~1.5% from call to call.
#
#   scripts/gpu/ab_stage.sh main wip/attn-ku2-stream      # names: the refs, '/' -> '-'
#
# Each ref is built in a temporary worktree under ${AB_WORK:-/tmp/fdl-ab} (CUDA for sm_90,
# ccache when present), removed after; binaries are stripped. The carried folders must stay under 64 MiB in all
# (~7 MB per bench_gpu).
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/device_libs.sh
[ $# -ge 1 ] || { echo "usage: $0 REF [REF ...]" >&2; exit 2; }
WORK=${AB_WORK:-/tmp/fdl-ab}
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
rm -rf .device/ab
mkdir -p .device/ab .device/lib "$WORK"
for ref in "$@"; do
  name=${ref//\//-}
  git rev-parse --verify --quiet "$ref^{commit}" >/dev/null || { echo "ab_stage.sh: unknown ref $ref" >&2; exit 1; }
  tree="$WORK/$name"
  git worktree remove --force "$tree" 2>/dev/null || rm -rf "$tree"
  git worktree add --detach "$tree" "$ref" >/dev/null
  cmake -S "$tree" -B "$tree/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHDLLM_BUILD_BENCH=OFF \
        -DCMAKE_CUDA_ARCHITECTURES=90a "${launcher[@]}" >/dev/null
  ninja -C "$tree/build" bench_gpu flashdllm >/dev/null
  cp "$tree/build/bin/bench_gpu" ".device/ab/$name"
  strip ".device/ab/$name"
  [ -f .device/ab/flashdllm ] || { cp "$tree/build/bin/flashdllm" .device/ab/flashdllm; strip .device/ab/flashdllm; }
  echo "$name: $(git rev-parse --short "$ref")" | tee -a .device/ab/REFS
  git worktree remove --force "$tree"  # the same path next time: ccache still hits
done
copy_device_libs .device/lib
du -sh .device/ab .device/lib
