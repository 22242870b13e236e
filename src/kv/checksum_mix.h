// checksum_mix.h — the per-word terms of block_checksum (flashdllm/kv_cache.h), shared by the
// CPU reference and the CUDA kernel so that both compute the same value by construction.
// The mixer is splitmix64's finaliser (Steele, Lea, Flood: "Fast splittable pseudorandom
// number generators", OOPSLA 2014): every input bit flips about half of the output bits.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define FDL_CHECKSUM_FN __host__ __device__ __forceinline__
#else
#define FDL_CHECKSUM_FN inline
#endif

namespace fdl::kv {

inline constexpr uint64_t kChecksumGolden = 0x9E3779B97F4A7C15ull;

FDL_CHECKSUM_FN uint64_t checksum_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// Term of 8-byte word `word` at word index `i` of a block.
FDL_CHECKSUM_FN uint64_t checksum_term(uint64_t word, uint64_t i) {
  return checksum_mix(word ^ ((i + 1) * kChecksumGolden));
}

/// The block's checksum from the sum of its terms and its length in bytes.
FDL_CHECKSUM_FN uint64_t checksum_final(uint64_t sum, uint64_t bytes) {
  return checksum_mix(sum ^ checksum_mix(bytes));
}

}  // namespace fdl::kv
