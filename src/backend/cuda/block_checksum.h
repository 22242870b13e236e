// block_checksum.h — the device side of block_checksum (flashdllm/kv_cache.h) for the KV
// tier copies: one launch checksums many blocks of an arena. CUDA C++17 (no std::span).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace fdl::cuda {

/// Launches the checksum of `n` blocks of `block_bytes` (a multiple of 8) at `arena` +
/// ids[i] * block_bytes into sums[i] (ids and sums may be mapped page-locked host memory), on
/// `stream`. Throws CudaError when the launch fails.
void launch_block_checksums(const uint8_t* arena, size_t block_bytes, const int32_t* ids, int n,
                            uint64_t* sums, cudaStream_t stream);

}  // namespace fdl::cuda
