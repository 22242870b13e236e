// The FFN half of a batch-1 decode layer in one kernel (contract in kernels.h):
//   residual add + RMSNorm -> gate/up projection -> SwiGLU -> down projection.
// As separate kernels (gemv_norm_swiglu, gemv down) the hand-over between them is a kernel
// boundary, ~5-7 µs on an H200 with HBM idle; here one block per SM stays resident and the
// down projection starts behind one grid-wide counter (decode_block.cuh), its first weight
// loads already in flight. The SwiGLU output h is written to global memory and staged into
// each block's shared memory after the hand-off (57 KB for Llama-3-8B, read once per block
// from L2 instead of once per warp).
// Arithmetic: the unfused kernels' (gemv.cu's fp32 dot loop in the same lane order, silu_mul's
// formula), the fp64 norm sum over 512 threads: values agree with gemv_norm_swiglu + gemv to
// fp32 rounding (tests/gpu/decode_block_test.cpp).
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/decode_block.cuh"
#include "backend/cuda/ffn_act.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.h"

#include <algorithm>
#include <string>

namespace fdl::cuda {
namespace {

using namespace block;
// stream_rows' batch (UNROLL 16-byte vectors per lane) and register buffers. H200, batch-1
// Llama-3-8B step: 8 x 2 4.39 ms; deeper rings were slower (12 x 2 4.65, 6 x 3 4.64,
// 4 x 4 4.77, 8 x 3 4.50: spills), and so was one undoubled batch of 16 (docs/GPU.md).
constexpr int kUnroll = 8, kBuffers = 2;

// kTrace: the phase stamps compiled in (a.trace set), as in decode_attention_block.cu.
// kAddW (in.add_w set: a post-norm of the addend) and kGelu (GeGLU) are compiled in only for
// the families that use them, so SwiGLU families keep the plain kernel's code.
// kSplitDown (split_down()): a block's down rows do not divide evenly among its warps (Gemma 2
// 9B: 28 rows for 16 warps, so 12 warps would stream two rows and 4 one); the warps take equal
// runs of the rows' weight batches instead, and each row sums its runs' partial dot products
// in warp order.
template <typename WT, bool kTrace, bool kAddW, bool kGelu, bool kSplitDown>
__global__ void __launch_bounds__(kThreads, 1) ffn_block_kernel(FfnBlockArgs a) {
  extern __shared__ float4 smem4[];
  auto stamp = [&](int event) {
    if constexpr (kTrace) block::stamp(a.trace, event);
  };
  float* xs = reinterpret_cast<float*>(smem4);        // [max(cols, n_ff)]: the normalized row, then h
  float* ws = xs + ((max(a.cols, a.n_ff) + 3) & ~3);  // [cols] the norm weight
  launch_dependents();
  stamp(kFfnEntry);
  constexpr int kVec = Widen<WT>::kVec;
  const int cols = a.cols, n_ff = a.n_ff;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const WT* Wgu = static_cast<const WT*>(a.w_gate_up);
  const WT* Wd = static_cast<const WT*>(a.w_down);
  // Gate/up pairs and down rows: contiguous shares per block, dealt to warps round-robin. A
  // warp computes pair p as gate row p then up row n_ff + p.
  const int64_t pchunk = (n_ff + gridDim.x - 1) / gridDim.x;
  const int64_t p0 = ::min(int64_t(n_ff), int64_t(blockIdx.x) * pchunk), p1 = ::min(int64_t(n_ff), p0 + pchunk);
  const int dchunk = int((a.down_rows + gridDim.x - 1) / gridDim.x);
  const int64_t d0 = ::min(a.down_rows, int64_t(blockIdx.x) * dchunk), d1 = ::min(a.down_rows, d0 + dchunk);
  const int gu_nvec = cols / kVec, d_nvec = n_ff / kVec;
  auto gu_ptr = [&](int64_t row) { return reinterpret_cast<const uint4*>(Wgu + row * cols); };
  auto d_ptr = [&](int64_t row) { return reinterpret_cast<const uint4*>(Wd + row * n_ff); };

  uint4 w[kBuffers][kUnroll];
  if (p0 + warp < p1) load_first<kUnroll>(gu_ptr(p0 + warp), w[0], gu_nvec, lane);
  norm_weight_prefetch(a.in, cols, ws);
  grid_dependency_wait();
  stamp(kFfnAfterPdlWait);
  norm_to_smem<kThreads, kAddW>(a.in, cols, ws, xs);
  stamp(kFfnNormDone);
  // kSplitDown: the down rows' partial sums [dchunk][kWarps] where the norm weight was (no
  // longer read); zeros where a warp's run misses a row. Visible to all after arrive's barrier.
  float* parts = ws;
  if constexpr (kSplitDown)
    for (int i = threadIdx.x; i < dchunk * kWarps; i += kThreads) parts[i] = 0.f;

  // Rows 2j and 2j + 1 of this warp's stream: gate and up rows of pair p0 + warp + 16 j.
  const int my_pairs = p0 + warp < p1 ? int((p1 - p0 - warp + kWarps - 1) / kWarps) : 0;
  float gate = 0.f;
  stream_rows<WT, kUnroll, kBuffers>(
      2 * my_pairs, [&](int i) { return gu_ptr((i & 1) * int64_t(n_ff) + p0 + warp + int64_t(kWarps) * (i >> 1)); },
      xs, gu_nvec, lane, w, [&](int i, float v) {
        if (!(i & 1)) {
          gate = v;
        } else if (lane == 0) {
          const int64_t p = p0 + warp + int64_t(kWarps) * (i >> 1);
          a.h[p] = ffn_act(gate, v, kGelu);  // silu_mul's formula
        }
      });

  // Down needs all of h: its first loads go out between the arrival and the wait.
  arrive(a.sync);
  stamp(kFfnGateUpDone);
  // kSplitDown: this warp's run [k0, k1) of the block's down batches.
  const int per_row = (d_nvec + 32 * kUnroll - 1) / (32 * kUnroll), total = int(d1 - d0) * per_row;
  const int k0 = warp * total / kWarps, k1 = (warp + 1) * total / kWarps;
  auto local_row = [&](int i) { return d_ptr(d0 + i); };
  if constexpr (kSplitDown) {
    if (k0 < k1) load_batch<kUnroll>(local_row, k0, per_row, d_nvec, lane, w[0]);
  } else {
    if (d0 + warp < d1) load_first<kUnroll>(d_ptr(d0 + warp), w[0], d_nvec, lane);
  }
  wait_for(a.sync, gridDim.x);
  stamp(kFfnHHandedOff);
  stage_to_smem(a.h, n_ff, xs);
  if constexpr (kSplitDown) {
    stream_batches<WT, kUnroll, kBuffers>(k0, k1, per_row, local_row, xs, d_nvec, lane, w, [&](int i, float v) {
      if (lane == 0) parts[i * kWarps + warp] = v;
    });
    __syncthreads();
    for (int i = threadIdx.x; i < int(d1 - d0); i += kThreads) {
      float y = 0.f;
#pragma unroll
      for (int k = 0; k < kWarps; ++k) y += parts[i * kWarps + k];
      a.y[d0 + i] = y;
    }
  } else {
    const int my_rows = d0 + warp < d1 ? int((d1 - d0 - warp + kWarps - 1) / kWarps) : 0;
    stream_rows<WT, kUnroll, kBuffers>(
        my_rows, [&](int i) { return d_ptr(d0 + warp + int64_t(kWarps) * i); }, xs, d_nvec, lane, w,
        [&](int i, float v) {
          if (lane == 0) a.y[d0 + warp + int64_t(kWarps) * i] = v;
        });
  }
  if constexpr (kTrace) {
    __syncthreads();
    stamp(kFfnEnd);
  }
}

size_t ffn_smem_bytes(int cols, int n_ff) {
  return (size_t((std::max(cols, n_ff) + 3) & ~3) + size_t(cols)) * sizeof(float);
}

// Planning (ffn_block_blocks) sizes the grid for the untraced kernel; a launch checks the
// instantiation it runs.
template <typename WT>
int64_t capacity(size_t smem) {
  return resident_blocks(reinterpret_cast<const void*>(ffn_block_kernel<WT, false, false, false, false>), smem);
}

bool rows_ok(const DeviceMatrix& W) {
  return W.cols > 0 && W.cols % 4 == 0 && (W.cols * int64_t(wtype_size(W.type))) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(W.data) % 16 == 0;
}

// Whether the down rows go to warps in equal runs of batches (the kernel's kSplitDown): a
// block's share of rows is more than one per warp but not a multiple of the warps, and the
// partial sums ([rows][kWarps] floats) fit where the norm weight was (cols floats).
bool split_down(const FfnBlockArgs& a) {
  const int64_t dchunk = (a.down_rows + a.blocks - 1) / a.blocks;
  return dchunk > kWarps && dchunk % kWarps != 0 && dchunk * kWarps <= a.cols;
}

template <typename WT, bool kAddW, bool kGelu>
auto* kernel_for(bool trace, bool split) {
  if (split) return trace ? ffn_block_kernel<WT, true, kAddW, kGelu, true> : ffn_block_kernel<WT, false, kAddW, kGelu, true>;
  return trace ? ffn_block_kernel<WT, true, kAddW, kGelu, false> : ffn_block_kernel<WT, false, kAddW, kGelu, false>;
}

template <typename WT>
void launch_typed(const FfnBlockArgs& a, cudaStream_t stream) {
  const size_t smem = ffn_smem_bytes(a.cols, a.n_ff);
  const bool add_w = a.in.add_w != nullptr, split = split_down(a);
  auto* typed = add_w ? (a.gelu ? kernel_for<WT, true, true>(a.trace, split) : kernel_for<WT, true, false>(a.trace, split))
                      : (a.gelu ? kernel_for<WT, false, true>(a.trace, split) : kernel_for<WT, false, false>(a.trace, split));
  const void* kernel = reinterpret_cast<const void*>(typed);
  if (a.blocks > resident_blocks(kernel, smem))  // the hand-off would wait forever
    throw CudaError("decode_ffn_block: " + std::to_string(a.blocks) + " blocks cannot be resident at once (" +
                    std::to_string(resident_blocks(kernel, smem)) + " fit)");
  launch_pdl(typed, dim3(unsigned(a.blocks)), dim3(kThreads), smem, stream, a);
}

}  // namespace

int ffn_block_blocks(const DeviceMatrix& w_gate_up, const DeviceMatrix& w_down, int n_sm) {
  if (w_gate_up.quantized() || w_down.quantized()) return 0;  // 16- and 32-bit rows only
  if (w_gate_up.type != w_down.type || !rows_ok(w_gate_up) || !rows_ok(w_down)) return 0;
  if (w_gate_up.rows % 2 != 0 || w_down.cols != w_gate_up.rows / 2 || w_gate_up.cols > 16384) return 0;
  const size_t smem = ffn_smem_bytes(int(w_gate_up.cols), int(w_down.cols));
  int64_t fit = 0;
  switch (w_gate_up.type) {
    case WType::F32: fit = capacity<float>(smem); break;
    case WType::F16: fit = capacity<__half>(smem); break;
    case WType::BF16: fit = capacity<__nv_bfloat16>(smem); break;
  }
  return n_sm >= 1 && n_sm <= fit ? n_sm : 0;  // one block per SM, all resident at once
}

void decode_ffn_block(const FfnBlockArgs& a, cudaStream_t stream) {
  if (a.blocks < 1) throw CudaError("decode_ffn_block: no blocks (use ffn_block_blocks)");
  switch (a.type) {
    case WType::F32: return launch_typed<float>(a, stream);
    case WType::F16: return launch_typed<__half>(a, stream);
    case WType::BF16: return launch_typed<__nv_bfloat16>(a, stream);
  }
}

}  // namespace fdl::cuda
