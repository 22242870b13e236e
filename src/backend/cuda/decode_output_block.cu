// The output head of a batch-1 decode step in one kernel (contract in kernels.h):
//   residual add + final RMSNorm -> output projection (logits).
// As two kernels (add_rms_norm, then gemv) the norm is its own launch and boundary, and the
// GEMV streams the largest matrix of the step (Llama-3-8B: 128256 x 4096 bf16, 1.05 GB) in
// 8-row blocks with one register batch per warp. Here one block of 512 threads per SM
// normalizes the row into shared memory (the FFN kernel's prologue, its weight copied before
// the PDL wait) and streams a contiguous share of the rows through two register batches per
// warp (stream_rows, as the FFN's projections: decode_block.cuh), first loads before the wait.
// No block waits for another, so nothing needs to be co-resident.
// Arithmetic: gemv.cu's fp32 dot loop in the same lane order; the norm's fp64 sum over 512
// threads instead of add_rms_norm's order: logits agree with the two kernels to fp32 rounding
// (tests/gpu/decode_block_test.cpp).
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/decode_block.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.h"

#include <string>

namespace fdl::cuda {
namespace {

using namespace block;
constexpr int kUnroll = 8, kBuffers = 2;  // stream_rows' ring, as the FFN kernel's (docs/GPU.md)

// kAddW: the norm's addend has a post-norm (NormIn::add_w), compiled in only where used.
template <typename WT, bool kAddW>
__global__ void __launch_bounds__(kThreads, 1) output_block_kernel(OutputBlockArgs a) {
  extern __shared__ float4 smem4[];
  float* xs = reinterpret_cast<float*>(smem4);  // [cols] the normalized row
  float* ws = xs + a.cols;                      // [cols] the norm weight
  launch_dependents();
  constexpr int kVec = Widen<WT>::kVec;
  const int cols = a.cols, nvec = cols / kVec;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const WT* W = static_cast<const WT*>(a.w);
  // A contiguous share of rows per block, dealt to its warps round-robin.
  const int64_t chunk = (a.rows + gridDim.x - 1) / gridDim.x;
  const int64_t r0 = ::min(a.rows, int64_t(blockIdx.x) * chunk), r1 = ::min(a.rows, r0 + chunk);
  auto row_ptr = [&](int64_t row) { return reinterpret_cast<const uint4*>(W + row * cols); };
  uint4 w[kBuffers][kUnroll];
  if (r0 + warp < r1) load_first<kUnroll>(row_ptr(r0 + warp), w[0], nvec, lane);
  norm_weight_prefetch(a.in, cols, ws);
  grid_dependency_wait();
  norm_to_smem<kThreads, kAddW>(a.in, cols, ws, xs);
  const int my_rows = r0 + warp < r1 ? int((r1 - r0 - warp + kWarps - 1) / kWarps) : 0;
  stream_rows<WT, kUnroll, kBuffers>(
      my_rows, [&](int i) { return row_ptr(r0 + warp + int64_t(kWarps) * i); }, xs, nvec, lane, w,
      [&](int i, float v) {
        // softcap(): the same expression, so a capped logit is bit-identical either way.
        if (lane == 0) a.y[r0 + warp + int64_t(kWarps) * i] = a.softcap > 0 ? __fmul_rn(a.softcap, tanhf(__fdiv_rn(v, a.softcap))) : v;
      });
}

size_t output_smem_bytes(int cols) { return 2 * size_t(cols) * sizeof(float); }

template <typename WT>
void launch_typed(const OutputBlockArgs& a, cudaStream_t stream) {
  const size_t smem = output_smem_bytes(a.cols);
  auto* kernel = a.in.add_w ? output_block_kernel<WT, true> : output_block_kernel<WT, false>;
  // (Also raises the kernel's dynamic shared memory limit where smem needs it.)
  if (resident_blocks(reinterpret_cast<const void*>(kernel), smem) == 0)
    throw CudaError("decode_output_block: " + std::to_string(smem) + " bytes of shared memory do not fit a block");
  launch_pdl(kernel, dim3(unsigned(a.blocks)), dim3(kThreads), smem, stream, a);
}

}  // namespace

bool output_block_supported(const DeviceMatrix& W) {
  // Up to 8192 columns: the widths tested on the H200 (64 KiB of shared memory per block).
  return !W.quantized() && W.rows > 0 && W.cols > 0 && W.cols % 4 == 0 && W.cols <= 8192 &&
         (W.cols * int64_t(wtype_size(W.type))) % 16 == 0 && reinterpret_cast<uintptr_t>(W.data) % 16 == 0;
}

void decode_output_block(const OutputBlockArgs& a, cudaStream_t stream) {
  if (a.blocks < 1) throw CudaError("decode_output_block: no blocks");
  if (!output_block_supported(DeviceMatrix{a.type, a.w, a.rows, a.cols}))
    throw CudaError("decode_output_block: unsupported matrix (" + std::to_string(a.rows) + " x " +
                    std::to_string(a.cols) + ", cols a multiple of 4 up to 8192, 16-byte rows)");
  switch (a.type) {
    case WType::F32: return launch_typed<float>(a, stream);
    case WType::F16: return launch_typed<__half>(a, stream);
    case WType::BF16: return launch_typed<__nv_bfloat16>(a, stream);
  }
}

}  // namespace fdl::cuda
