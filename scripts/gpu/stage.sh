#!/usr/bin/env bash
# Stage what the GPU machine needs into .device/ (ignored by git; carried by the `run` tool):
# the binaries built here in build-cuda/, the shared libraries the GPU machine's image lacks,
# the small test models and the reference JSON (../shared does not travel).
#
#   cmake -S . -B build-cuda -G Ninja -DFLASHDLLM_BUILD_BENCH=OFF -DCMAKE_CUDA_ARCHITECTURES=90a
#   ninja -C build-cuda test_gpu flashdllm bench_gpu gemm_k16_bench
#   scripts/gpu/stage.sh            # then run scripts/gpu/run_on_device.sh there
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/device_libs.sh
SHARED=${FLASHDLLM_SHARED:-../shared}
BUILD=${BUILD:-build-cuda}
rm -rf .device
mkdir -p .device/bin .device/lib .device/shared/models .device/shared/reference .device/bench
for b in test_gpu flashdllm bench_gpu gemm_k16_bench; do
  [ -x "$BUILD/bin/$b" ] || { echo "stage.sh: $BUILD/bin/$b is missing; build it first" >&2; exit 1; }
  cp "$BUILD/bin/$b" .device/bin/
  strip .device/bin/$b
done
copy_device_libs .device/lib
cp "$SHARED/models/stories260K.gguf" "$SHARED/models/codelm-16m-f16.gguf" .device/shared/models/
cp "$SHARED"/reference/*.json .device/shared/reference/
cp bench/gpu/hf_peer.py .device/bench/
du -sh .device
