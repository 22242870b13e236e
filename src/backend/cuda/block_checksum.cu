// The device checksum of KV blocks moved by the tier copies (kv/checksum_mix.h): one thread
// block per KV block, each thread summing the terms of a strided share of its 8-byte words.
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/block_checksum.h"
#include "kv/checksum_mix.h"

namespace fdl::cuda {
namespace {

// 512 threads, each with eight 16-byte loads in flight (64 KiB per thread block): a 2 MiB
// block is streamed in ~32 round trips to HBM, so a copy group's checksums hold SMs that the
// forwards running beside them want for tens of microseconds, not hundreds.
constexpr int kThreads = 512;
constexpr int kUnroll = 8;

__global__ void __launch_bounds__(kThreads) block_checksums_kernel(const uint8_t* __restrict__ arena, size_t block_bytes,
                                                                   const int32_t* __restrict__ ids,
                                                                   uint64_t* __restrict__ sums) {
  const int32_t id = ids[blockIdx.x];
  const uint8_t* block = arena + size_t(id) * block_bytes;
  const size_t n_words = block_bytes / 8;
  unsigned long long sum = 0;
  // The sum of the terms is order-free (modulo 2^64), so any split of the words gives the
  // CPU reference's value. Pairs of words as 16-byte loads where the block allows them.
  size_t done = 0;
  if (reinterpret_cast<uintptr_t>(block) % 16 == 0) {
    const auto* pairs = reinterpret_cast<const ulonglong2*>(block);
    const size_t n_pairs = n_words / 2;
    size_t j = threadIdx.x;
    for (; j + (kUnroll - 1) * kThreads < n_pairs; j += kUnroll * kThreads) {
      ulonglong2 w[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) w[u] = __ldg(pairs + j + u * kThreads);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const size_t i = 2 * (j + size_t(u) * kThreads);
        sum += kv::checksum_term(w[u].x, i) + kv::checksum_term(w[u].y, i + 1);
      }
    }
    for (; j < n_pairs; j += kThreads) {
      const ulonglong2 w = __ldg(pairs + j);
      sum += kv::checksum_term(w.x, 2 * j) + kv::checksum_term(w.y, 2 * j + 1);
    }
    done = 2 * n_pairs;
  }
  const auto* words = reinterpret_cast<const unsigned long long*>(block);
  for (size_t i = done + threadIdx.x; i < n_words; i += kThreads) sum += kv::checksum_term(__ldg(words + i), i);
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_down_sync(0xffffffffu, sum, o);
  __shared__ unsigned long long warp_sums[kThreads / 32];
  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned long long total = 0;
    for (int w = 0; w < kThreads / 32; ++w) total += warp_sums[w];
    sums[blockIdx.x] = kv::checksum_final(total, block_bytes);
  }
}

}  // namespace

void launch_block_checksums(const uint8_t* arena, size_t block_bytes, const int32_t* ids, int n, uint64_t* sums,
                            cudaStream_t stream) {
  if (n <= 0) return;
  block_checksums_kernel<<<n, kThreads, 0, stream>>>(arena, block_bytes, ids, sums);
  FDL_CUDA_CHECK_LAUNCH();
}

}  // namespace fdl::cuda
