// Tiled prefill attention on tensor cores (TF32 inputs, fp32 accumulation): the same work
// split, masking, split-K partials and tile layout as attn_tile_kernel in attention.cu, but
// Q·Kᵀ and P·V run as 16x16x8 WMMA products instead of fp32 FMAs on CUDA cores (the fp32
// kernel is instruction bound: ~70 GFLOP per 512-token Llama-3-8B prefill).
//
// Block (tile, kv head, split) of 8 warps; warp w owns query rows 16w..16w+15 of the tile
// (row r: token r / group, query head kvh * group + r % group). Per chunk of 32 positions:
//  1. the block stages K and V (fp32, row-major [position][dim]) in shared memory;
//  2. each warp computes S = Q·Kᵀ (16x32) from its Q fragments (registers, loaded once);
//  3. two lanes per row apply the causal mask and the online softmax to S in shared memory
//     (running max m and sum l per row, as the fp32 kernel), rescale the row's output O
//     (kept in shared memory, where the Q tile was staged) and leave P in S's place;
//  4. O += P·V.
// TF32 keeps 10 mantissa bits of q, k, p and v (errors ~1e-3 relative in the output), so
// this path is opt-in (AttentionArgs::tensor_cores).
#include <mma.h>

#include <cmath>
#include <string>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.h"

namespace fdl::cuda {
namespace {

using namespace nvcuda;

constexpr int kRows = 128, kWarps = kRows / 16, kThreads = 32 * kWarps, kChunk = 32;

template <int HD>
constexpr size_t tc_smem_floats() {
  return size_t(kRows) * HD      // Q tile, then the output accumulators O
         + 2 * size_t(kChunk) * HD  // K and V chunk
         + size_t(kRows) * kChunk;  // S / P, 16 x kChunk per warp
}

template <typename Frag>
__device__ __forceinline__ void to_tf32(Frag& f) {
#pragma unroll
  for (int i = 0; i < f.num_elements; ++i) f.x[i] = wmma::__float_to_tf32(f.x[i]);
}

template <int HD>
__global__ void __launch_bounds__(kThreads) attn_tile_tc_kernel(AttentionArgs a) {
  launch_dependents();
  grid_dependency_wait();
  extern __shared__ __align__(128) float4 sm4[];  // WMMA wants 32-byte aligned tiles
  float* qo = reinterpret_cast<float*>(sm4);  // [kRows][HD]
  float* ks = qo + kRows * HD;                // [kChunk][HD]
  float* vs = ks + kChunk * HD;               // [kChunk][HD]
  float* ss = vs + kChunk * HD;               // [kRows][kChunk]
  const KvLayerView& kv = a.kv;
  const int group = a.n_head / kv.n_head_kv;
  const int kvh = blockIdx.y;
  const int t0 = a.tile_starts[blockIdx.x], nt = a.tile_starts[blockIdx.x + 1] - t0;
  const int rows = nt * group;
  const int pos0 = a.positions[t0];
  const int p_last = pos0 + nt - 1;
  const int32_t* table = a.tables + a.table_off[t0];
  const int64_t kv_dim = int64_t(kv.n_head_kv) * HD;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  for (int idx = threadIdx.x; idx < kRows * (HD / 4); idx += kThreads) {
    const int rr = idx / (HD / 4), d4 = idx % (HD / 4);
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (rr < rows)
      v = *reinterpret_cast<const float4*>(
          a.q + (int64_t(t0 + rr / group) * a.n_head + kvh * group + rr % group) * HD + d4 * 4);
    *reinterpret_cast<float4*>(qo + rr * HD + d4 * 4) = v;
  }
  __syncthreads();
  float* ow = qo + warp * 16 * HD;  // this warp's 16 rows: Q first, O after the fragments are loaded
  float* sw = ss + warp * 16 * kChunk;
  wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major> qf[HD / 8];
#pragma unroll
  for (int k = 0; k < HD / 8; ++k) {
    wmma::load_matrix_sync(qf[k], ow + k * 8, HD);
    to_tf32(qf[k]);
  }
  __syncwarp();
  for (int i = lane; i < 16 * HD; i += 32) ow[i] = 0.f;

  // Softmax state: lanes 2i and 2i+1 share row i of the warp (each takes 16 of 32 columns).
  const int my_row = lane / 2, half = lane % 2;
  const int r_tile = warp * 16 + my_row;
  const int my_pos = r_tile < rows ? pos0 + r_tile / group : -1;  // -1: no such row, all masked
  const int warp_last_row = min(warp * 16 + 15, rows - 1);
  const int warp_max_pos = warp * 16 < rows ? pos0 + warp_last_row / group : -1;
  float m = -INFINITY, l = 0.f;

  const int n_chunks = p_last / kChunk + 1;
  const int per = (n_chunks + int(gridDim.z) - 1) / int(gridDim.z);
  const int c_begin = int(blockIdx.z) * per * kChunk;
  const int c_end = min(p_last + 1, c_begin + per * kChunk);
  for (int c0 = c_begin; c0 < c_end; c0 += kChunk) {
    __syncthreads();  // the previous chunk's K and V are consumed
    for (int idx = threadIdx.x; idx < 2 * kChunk * (HD / 4); idx += kThreads) {
      const bool is_v = idx >= kChunk * (HD / 4);
      const int i = is_v ? idx - kChunk * (HD / 4) : idx;
      const int jj = i / (HD / 4), d4 = i % (HD / 4);
      const int j = c0 + jj;
      float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
      if (j <= p_last)
        x = *reinterpret_cast<const float4*>(kv.base + int64_t(table[j / kv.block_size]) * kv.block_stride +
                                             kv.layer_offset +
                                             int64_t((is_v ? kv.block_size : 0) + j % kv.block_size) * kv_dim +
                                             int64_t(kvh) * HD + d4 * 4);
      *reinterpret_cast<float4*>((is_v ? vs : ks) + jj * HD + d4 * 4) = x;
    }
    __syncthreads();
    if (c0 > warp_max_pos) continue;  // every row of this warp is before the chunk (or absent)

    // S = Q·Kᵀ: Kᵀ (HD x kChunk) is K read column-major.
#pragma unroll
    for (int nb = 0; nb < kChunk / 16; ++nb) {
      wmma::fragment<wmma::accumulator, 16, 16, 8, float> sf;
      wmma::fill_fragment(sf, 0.f);
#pragma unroll
      for (int k = 0; k < HD / 8; ++k) {
        wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::col_major> kf;
        wmma::load_matrix_sync(kf, ks + nb * 16 * HD + k * 8, HD);
        to_tf32(kf);
        wmma::mma_sync(sf, qf[k], kf, sf);
      }
      wmma::store_matrix_sync(sw + nb * 16, sf, kChunk, wmma::mem_row_major);
    }
    __syncwarp();

    // Online softmax on this lane's half row; P replaces S.
    float* srow = sw + my_row * kChunk + half * 16;
    float sc[16];
    float cmax = -INFINITY;
#pragma unroll
    for (int jj = 0; jj < 16; ++jj) {
      const int j = c0 + half * 16 + jj;
      sc[jj] = j <= my_pos ? srow[jj] * a.scale : -INFINITY;
      cmax = fmaxf(cmax, sc[jj]);
    }
    cmax = fmaxf(cmax, __shfl_xor_sync(0xffffffffu, cmax, 1));
    const float m_new = fmaxf(m, cmax);
    // A row with nothing unmasked yet keeps m = -inf, p = 0 and its (zero) accumulators.
    const float corr = m_new == -INFINITY ? 1.f : expf(m - m_new);
    float psum = 0.f;
#pragma unroll
    for (int jj = 0; jj < 16; ++jj) {
      const float p = m_new == -INFINITY ? 0.f : expf(sc[jj] - m_new);
      srow[jj] = p;
      psum += p;
    }
    psum += __shfl_xor_sync(0xffffffffu, psum, 1);
    l = l * corr + psum;
    m = m_new;
    float* orow = ow + my_row * HD + half * (HD / 2);
#pragma unroll 8
    for (int d = 0; d < HD / 2; ++d) orow[d] *= corr;
    __syncwarp();

    // O += P·V.
#pragma unroll
    for (int db = 0; db < HD / 16; ++db) {
      wmma::fragment<wmma::accumulator, 16, 16, 8, float> of;
      wmma::load_matrix_sync(of, ow + db * 16, HD, wmma::mem_row_major);
#pragma unroll
      for (int k = 0; k < kChunk / 8; ++k) {
        wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major> pf;
        wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::row_major> vf;
        wmma::load_matrix_sync(pf, sw + k * 8, kChunk);
        wmma::load_matrix_sync(vf, vs + k * 8 * HD + db * 16, HD);
        to_tf32(pf);
        to_tf32(vf);
        wmma::mma_sync(of, pf, vf, of);
      }
      wmma::store_matrix_sync(ow + db * 16, of, HD, wmma::mem_row_major);
    }
    __syncwarp();
  }

  if (r_tile >= rows) return;
  const int64_t th = int64_t(t0 + r_tile / group) * a.n_head + kvh * group + r_tile % group;
  const float* orow = ow + my_row * HD + half * (HD / 2);
  if (gridDim.z == 1) {
    float* o = a.out + th * HD + half * (HD / 2);
    for (int d = 0; d < HD / 2; ++d) o[d] = orow[d] / l;
  } else {  // a partial (acc, m, l) for attn_combine_kernel; m = -inf when this share was empty
    float* o = a.partial + (th * gridDim.z + blockIdx.z) * (HD + 2);
    for (int d = 0; d < HD / 2; ++d) o[half * (HD / 2) + d] = orow[d];
    if (half == 0) {
      o[HD] = m;
      o[HD + 1] = l;
    }
  }
}

template <int HD>
void launch(const AttentionArgs& a, cudaStream_t stream) {
  const size_t smem = tc_smem_floats<HD>() * sizeof(float);
  static const bool configured = [&] {
    FDL_CUDA_CHECK(cudaFuncSetAttribute(attn_tile_tc_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    return true;
  }();
  (void)configured;
  launch_pdl(attn_tile_tc_kernel<HD>, dim3(unsigned(a.n_tiles), unsigned(a.kv.n_head_kv), unsigned(a.n_splits)),
             dim3(kThreads), smem, stream, a);
}

}  // namespace

void attention_tiles_tc(const AttentionArgs& a, cudaStream_t stream) {
  if (a.kv.head_dim == 64)
    launch<64>(a, stream);
  else if (a.kv.head_dim == 128)
    launch<128>(a, stream);
  else
    throw CudaError("attention_tiles_tc: head_dim " + std::to_string(a.kv.head_dim) + " is not 64 or 128");
}

}  // namespace fdl::cuda
