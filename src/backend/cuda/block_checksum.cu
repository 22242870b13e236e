// The device checksum of KV blocks moved by the tier copies (kv/checksum_mix.h): one thread
// block per KV block, each thread summing the terms of a strided share of its 8-byte words.
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/block_checksum.h"
#include "kv/checksum_mix.h"

namespace fdl::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void block_checksums_kernel(const uint8_t* __restrict__ arena, size_t block_bytes,
                                       const int32_t* __restrict__ ids, uint64_t* __restrict__ sums) {
  const int32_t id = ids[blockIdx.x];
  const auto* words = reinterpret_cast<const unsigned long long*>(arena + size_t(id) * block_bytes);
  const size_t n = block_bytes / 8;
  unsigned long long sum = 0;
  size_t i = threadIdx.x;
  // Four loads in flight per thread: the kernel streams the block once.
  for (; i + 3 * kThreads < n; i += 4 * kThreads) {
    const unsigned long long w0 = __ldg(words + i), w1 = __ldg(words + i + kThreads),
                             w2 = __ldg(words + i + 2 * kThreads), w3 = __ldg(words + i + 3 * kThreads);
    sum += kv::checksum_term(w0, i) + kv::checksum_term(w1, i + kThreads) +
           kv::checksum_term(w2, i + 2 * kThreads) + kv::checksum_term(w3, i + 3 * kThreads);
  }
  for (; i < n; i += kThreads) sum += kv::checksum_term(__ldg(words + i), i);
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
