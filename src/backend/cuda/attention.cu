// Paged causal attention over the fp32 KV arena, for any mix of prefill chunks and decode
// tokens of many sequences in one launch (contract in kernels.h).
//
// Work split: block (split, kv head [x query-head group], token). A block owns up to GM (<= 8)
// query heads sharing one KV head (GQA: each K/V vector is loaded once for all of them) and
// one contiguous chunk of the token's context [0, pos]. Inside the block, positions are dealt
// to sub-warp groups of `lanes` lanes; a lane holds 4*CH dims of q, k, v as float4, a group
// reduces q·k with shuffles and keeps an online softmax (running max m, sum l, weighted V
// sum). Groups are merged through shared memory and the block writes one partial (acc, m, l)
// per query head and split; a second kernel merges the splits (the split-K of
// flash-decoding), so long contexts spread over many SMs even at batch 1.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <type_traits>

#include "backend/cuda/attention_fold.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kv_elem.cuh"
#include "backend/cuda/launch.h"

namespace fdl::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kGMax = 8;

__device__ __forceinline__ float dot4(const float4& a, const float4& b) {
  return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
}
__device__ __forceinline__ float4 axpby(const float4& x, float a, const float4& y, float b) {
  return make_float4(x.x * a + y.x * b, x.y * a + y.y * b, x.z * a + y.z * b, x.w * a + y.w * b);
}

// The kernel parameter of a variant with (MaskedAttentionArgs) or without masks.
template <bool MASKED>
using ArgsOf = std::conditional_t<MASKED, MaskedAttentionArgs, AttentionArgs>;

// MASKED: the batch holds token trees or a sliding window, or the scores are soft-capped
// (AttentionMasks): slots of other branches and before the window are skipped as positions
// past the context are; the splits share out the window only. A separate instantiation with its own parameter type, so steps
// without masks run exactly the kernel they ran before.
template <typename KvT, int CH, int GM, int U, bool MASKED>
__global__ void __launch_bounds__(kThreads) attn_partial_kernel(ArgsOf<MASKED> a, int lanes) {
  extern __shared__ float smem[];
  launch_dependents();
  grid_dependency_wait();
  const int t = blockIdx.z;
  const KvLayerView& kv = a.kv;
  const int hd = kv.head_dim, hd4 = hd / 4;
  const int group = a.n_head / kv.n_head_kv;
  const int n_hg = (group + GM - 1) / GM;
  const int kvh = blockIdx.y / n_hg, hg = blockIdx.y % n_hg;
  const int h0 = kvh * group + hg * GM;
  const int gcount = min(GM, group - hg * GM);
  const int ctx = a.positions[t] + 1;
  RowMask mask{0, INT_MAX, 0};
  if constexpr (MASKED) mask = row_mask_of(a, t);
  const int per = (ctx - mask.lo + a.n_splits - 1) / a.n_splits;
  const int begin = mask.lo + blockIdx.x * per, end = min(ctx, begin + per);

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int groups_per_warp = 32 / lanes;
  const int sub = lane / lanes, li = lane % lanes;
  const int n_slots = (kThreads / 32) * groups_per_warp;
  const int slot = warp * groups_per_warp + sub;

  float4 q[GM][CH];
#pragma unroll
  for (int g = 0; g < GM; ++g)
#pragma unroll
    for (int c = 0; c < CH; ++c) {
      const int chunk = li + c * lanes;
      q[g][c] = (g < gcount && chunk < hd4)
                    ? *reinterpret_cast<const float4*>(a.q + (int64_t(t) * a.n_head + h0 + g) * hd + chunk * 4)
                    : make_float4(0.f, 0.f, 0.f, 0.f);
    }
  float m[GM], l[GM];
  float4 acc[GM][CH];
#pragma unroll
  for (int g = 0; g < GM; ++g) {
    m[g] = -INFINITY, l[g] = 0.f;
#pragma unroll
    for (int c = 0; c < CH; ++c) acc[g][c] = make_float4(0.f, 0.f, 0.f, 0.f);
  }

  const int32_t* table = a.tables + a.table_off[t];
  const int64_t kv_dim = int64_t(kv.n_head_kv) * hd;
  // U positions per group and iteration, all loaded before any is used (more loads in
  // flight). The loop bound is uniform across the warp (every lane takes part in the shuffles).
  for (int j0 = begin + warp * groups_per_warp; j0 < end; j0 += U * n_slots) {
    float4 k[U][CH], v[U][CH];
    bool valid[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int j = j0 + sub + u * n_slots;
      valid[u] = j < end;
      if constexpr (MASKED) valid[u] = valid[u] && mask.keeps(j);  // j < end <= the token's slot + 1
      if (valid[u]) {
        const KvT* kp = kv_ptr<KvT>(kv, table[j / kv.block_size], j % kv.block_size, int64_t(kvh) * hd);
        const KvT* vp = kp + int64_t(kv.block_size) * kv_dim;
#pragma unroll
        for (int c = 0; c < CH; ++c) {
          const int chunk = li + c * lanes;
          k[u][c] = chunk < hd4 ? KvElem<KvT>::load4(kp + chunk * 4) : make_float4(0.f, 0.f, 0.f, 0.f);
          v[u][c] = chunk < hd4 ? KvElem<KvT>::load4(vp + chunk * 4) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
      } else {
#pragma unroll
        for (int c = 0; c < CH; ++c) k[u][c] = v[u][c] = make_float4(0.f, 0.f, 0.f, 0.f);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
      for (int g = 0; g < GM; ++g) {
        if (g >= gcount) break;  // uniform across the block
        float s = 0.f;
#pragma unroll
        for (int c = 0; c < CH; ++c) s += dot4(q[g][c], k[u][c]);
        for (int o = lanes / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (valid[u]) {
          s *= a.scale;
          if constexpr (MASKED)
            if (a.masks.softcap > 0) s = __fmul_rn(a.masks.softcap, tanhf(__fdiv_rn(s, a.masks.softcap)));
          const float m_new = fmaxf(m[g], s);
          const float corr = expf(m[g] - m_new), p = expf(s - m_new);
          l[g] = l[g] * corr + p;
#pragma unroll
          for (int c = 0; c < CH; ++c) acc[g][c] = axpby(acc[g][c], corr, v[u][c], p);
          m[g] = m_new;
        }
      }
    }
  }

  // Merge the groups: smem holds per slot and head (acc[hd], m, l), records padded to a
  // multiple of 4 floats so the float4 stores stay aligned.
  const int rec = hd + 4;
  float* mine = smem + int64_t(slot) * GM * rec;
#pragma unroll
  for (int g = 0; g < GM; ++g) {
    if (g >= gcount) break;
    float* r = mine + g * rec;
    if (li == 0) r[hd] = m[g], r[hd + 1] = l[g];
#pragma unroll
    for (int c = 0; c < CH; ++c) {
      const int chunk = li + c * lanes;
      if (chunk < hd4) *reinterpret_cast<float4*>(r + chunk * 4) = acc[g][c];
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < gcount * hd; idx += kThreads) {
    const int g = idx / hd, d = idx % hd;
    float mx = -INFINITY;
    for (int s = 0; s < n_slots; ++s) mx = fmaxf(mx, smem[(int64_t(s) * GM + g) * rec + hd]);
    float o = 0.f, lsum = 0.f;
    if (mx != -INFINITY)
      for (int s = 0; s < n_slots; ++s) {
        const float* r = smem + (int64_t(s) * GM + g) * rec;
        const float w = expf(r[hd] - mx);  // 0 for empty slots (m = -inf)
        o += r[d] * w;
        lsum += r[hd + 1] * w;
      }
    float* out = a.partial + ((int64_t(t) * a.n_head + h0 + g) * a.n_splits + blockIdx.x) * (hd + 2);
    out[d] = o;
    if (d == 0) out[hd] = mx, out[hd + 1] = lsum;
  }
}

// One block per (token, head).
__global__ void attn_combine_kernel(const float* partial, float* out, int n_splits, int hd) {
  launch_dependents();
  grid_dependency_wait();
  extern __shared__ float weight[];  // n_splits
  __shared__ float red[32];
  const int64_t th = blockIdx.x;  // token * n_head + head
  float* row = out + th * hd;
  combine_row(partial + th * n_splits * (hd + 2), [&](int d, float v) { row[d] = v; }, n_splits, hd, weight, red,
              blockDim.x);
}

// Batch-invariant steps whose chunks ran side by side (attention_invariant_chunk_partials):
// one block per (token, head), fold_combine_row (attention_fold.cuh).
// Shared memory: the split weights (n_splits floats, rounded up to 8 bytes), then, where
// `staged`, the row's records (fold_stage_floats).
__global__ void attn_fold_combine_kernel(float* partial, float* out, int n_splits, int share_chunks, int hd,
                                         bool staged) {
  launch_dependents();
  grid_dependency_wait();
  extern __shared__ float weight[];
  __shared__ float red[32];
  const int64_t th = blockIdx.x;
  float* row = out + th * hd;
  float* stage = staged ? weight + (n_splits + 1) / 2 * 2 : nullptr;
  fold_combine_row(partial, th, gridDim.x, n_splits, share_chunks, hd, [&](int d, float v) { row[d] = v; }, weight,
                   red, blockDim.x, stage, staged ? fold_stage_floats(n_splits, share_chunks, hd) : 0);
}

// The fold kernel's shared memory works from a copy of each row's records up to this size:
// the default limit of a launch's dynamic shared memory, less the kernel's static `red`.
constexpr size_t kFoldStageMaxBytes = (48 << 10) - 32 * sizeof(float);

// Tiled causal attention for runs of consecutive positions of one sequence (prefill chunks):
// block (tile, kv head); thread r < tile_tokens * group owns query row r (token r / group,
// head kvh * group + r % group) with its output in registers. K and V are staged 32
// positions at a time in shared memory, transposed so that the 32 scores of a row and dim
// come from 8 broadcast float4 reads; each K/V vector is read once per tile instead of once
// per query token. Scores, masking (position j > the row's position), online softmax and
// P·V in fp32. MASKED: positions are KV slots, and a tree row also masks the slots its ancestor
// mask leaves out (a tree is a run of consecutive slots, so it tiles like a prefill run); with a
// sliding window the tile's context starts at the chunk of its lowest first slot.
constexpr int kTileRows = 128, kChunk = 32;

template <int HD, bool MASKED>
__global__ void __launch_bounds__(kTileRows) attn_tile_kernel(ArgsOf<MASKED> a) {
  launch_dependents();
  grid_dependency_wait();
  extern __shared__ float sm[];
  float* qs = sm;                          // [HD][kTileRows + 1]
  float* ks = qs + HD * (kTileRows + 1);   // [HD][kChunk]
  float* vs = ks + HD * kChunk;            // [kChunk][HD]
  const KvLayerView& kv = a.kv;
  const int group = a.n_head / kv.n_head_kv;
  const int kvh = blockIdx.y;
  const int t0 = a.tile_starts[blockIdx.x], nt = a.tile_starts[blockIdx.x + 1] - t0;
  const int rows = nt * group;
  const int r = threadIdx.x;
  const int p_last = a.positions[t0] + nt - 1;
  const int my_pos = a.positions[t0] + r / group;
  const int32_t* table = a.tables + a.table_off[t0];
  RowMask mask{0, INT_MAX, 0};
  int c_first = 0;  // the tile's context starts at this chunk (sliding window)
  if constexpr (MASKED) {
    if (r < rows) mask = row_mask_of(a, t0 + r / group);
    c_first = tile_first(a, t0, nt) / kChunk * kChunk;
  }

  for (int idx = threadIdx.x; idx < rows * HD; idx += kTileRows) {
    const int rr = idx / HD, d = idx % HD;
    qs[d * (kTileRows + 1) + rr] = a.q[(int64_t(t0 + rr / group) * a.n_head + kvh * group + rr % group) * HD + d];
  }
  float m = -INFINITY, l = 0.f;
  float acc[HD];
#pragma unroll
  for (int d = 0; d < HD; ++d) acc[d] = 0.f;

  // This block's share of the tile's context (split-K over chunks of kChunk positions: more
  // blocks, and the long tiles at the end of a prompt no longer set the kernel's length).
  const int n_chunks = (p_last - c_first) / kChunk + 1;
  const int per = (n_chunks + int(gridDim.z) - 1) / int(gridDim.z);
  const int c_begin = c_first + int(blockIdx.z) * per * kChunk;
  const int c_end = min(p_last + 1, c_begin + per * kChunk);
  for (int c0 = c_begin; c0 < c_end; c0 += kChunk) {
    __syncthreads();  // the previous chunk is consumed (and qs is written, the first time)
    // K transposed ([d][j]: the 32 scores of a dim are one broadcast row); V row-major
    // ([j][d]: P·V walks positions outside, dims inside, 128 independent accumulators).
    for (int idx = threadIdx.x; idx < kChunk * (HD / 4); idx += kTileRows) {
      const int jj = idx % kChunk, d4 = idx / kChunk;
      const int j = c0 + jj;
      float4 kk = make_float4(0.f, 0.f, 0.f, 0.f);
      if (j <= p_last)
        kk = KvElem<float>::load4(kv_ptr<float>(kv, table[j / kv.block_size], j % kv.block_size,
                                                 int64_t(kvh) * HD + d4 * 4));
      float* kd = ks + (d4 * 4) * kChunk + jj;
      kd[0] = kk.x, kd[kChunk] = kk.y, kd[2 * kChunk] = kk.z, kd[3 * kChunk] = kk.w;
    }
    for (int idx = threadIdx.x; idx < kChunk * (HD / 4); idx += kTileRows) {
      const int d4 = idx % (HD / 4), jj = idx / (HD / 4);
      const int j = c0 + jj;
      float4 vv = make_float4(0.f, 0.f, 0.f, 0.f);
      if (j <= p_last)
        vv = KvElem<float>::load4(kv_ptr<float>(kv, table[j / kv.block_size], kv.block_size + j % kv.block_size,
                                                 int64_t(kvh) * HD + d4 * 4));
      *reinterpret_cast<float4*>(vs + jj * HD + d4 * 4) = vv;
    }
    __syncthreads();
    if (r < rows && c0 <= my_pos) {
      float sc[kChunk];
#pragma unroll
      for (int j = 0; j < kChunk; ++j) sc[j] = 0.f;
#pragma unroll 4
      for (int d = 0; d < HD; ++d) {
        const float qd = qs[d * (kTileRows + 1) + r];
        const float4* kr = reinterpret_cast<const float4*>(ks + d * kChunk);
#pragma unroll
        for (int j4 = 0; j4 < kChunk / 4; ++j4) {
          const float4 k4 = kr[j4];
          sc[4 * j4] = fmaf(qd, k4.x, sc[4 * j4]);
          sc[4 * j4 + 1] = fmaf(qd, k4.y, sc[4 * j4 + 1]);
          sc[4 * j4 + 2] = fmaf(qd, k4.z, sc[4 * j4 + 2]);
          sc[4 * j4 + 3] = fmaf(qd, k4.w, sc[4 * j4 + 3]);
        }
      }
      float cmax = -INFINITY;
#pragma unroll
      for (int j = 0; j < kChunk; ++j) {
        bool keep = c0 + j <= my_pos;
        if constexpr (MASKED) keep = keep && mask.keeps(c0 + j);
        sc[j] = keep ? sc[j] * a.scale : -INFINITY;
        cmax = fmaxf(cmax, sc[j]);
      }
      const float m_new = fmaxf(m, cmax);
      // A masked row may find a chunk of its share all masked before any kept slot: nothing to
      // add (and expf(-inf - -inf) would be NaN). Without masks c0 <= my_pos keeps one.
      if constexpr (MASKED)
        if (m_new == -INFINITY) continue;
      const float corr = expf(m - m_new);
      float psum = 0.f;
#pragma unroll
      for (int j = 0; j < kChunk; ++j) {
        sc[j] = expf(sc[j] - m_new);  // 0 for masked positions
        psum += sc[j];
      }
      l = l * corr + psum;
#pragma unroll
      for (int d = 0; d < HD; ++d) acc[d] *= corr;
#pragma unroll
      for (int j = 0; j < kChunk; ++j) {
        const float4* vr = reinterpret_cast<const float4*>(vs + j * HD);
        const float pj = sc[j];
#pragma unroll
        for (int d4 = 0; d4 < HD / 4; ++d4) {
          const float4 v4 = vr[d4];
          acc[4 * d4] = fmaf(pj, v4.x, acc[4 * d4]);
          acc[4 * d4 + 1] = fmaf(pj, v4.y, acc[4 * d4 + 1]);
          acc[4 * d4 + 2] = fmaf(pj, v4.z, acc[4 * d4 + 2]);
          acc[4 * d4 + 3] = fmaf(pj, v4.w, acc[4 * d4 + 3]);
        }
      }
      m = m_new;
    }
  }
  if (r >= rows) return;
  const int64_t th = int64_t(t0 + r / group) * a.n_head + kvh * group + r % group;
  if (gridDim.z == 1) {
    float* o = a.out + th * HD;
#pragma unroll
    for (int d = 0; d < HD; ++d) o[d] = acc[d] / l;
  } else {  // a partial (acc, m, l) for attn_combine_kernel; m = -inf when this share was empty
    float* o = a.partial + (th * gridDim.z + blockIdx.z) * (HD + 2);
#pragma unroll
    for (int d = 0; d < HD; ++d) o[d] = acc[d];
    o[HD] = m;
    o[HD + 1] = l;
  }
}

template <int HD, bool MASKED>
void launch_tiles(const ArgsOf<MASKED>& a, cudaStream_t stream) {
  const size_t smem = size_t(HD) * ((kTileRows + 1) + 2 * kChunk) * sizeof(float);
  static const bool configured = [&] {
    FDL_CUDA_CHECK(
        cudaFuncSetAttribute(attn_tile_kernel<HD, MASKED>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    return true;
  }();
  (void)configured;
  launch_pdl(attn_tile_kernel<HD, MASKED>, dim3(unsigned(a.n_tiles), unsigned(a.kv.n_head_kv), unsigned(a.n_splits)),
             dim3(kTileRows), smem, stream, a);
}

// Lanes per position: a head's float4s spread over up to 32 lanes, except head_dim 128 with
// groups of 4 query heads (Llama-3-8B): 8 lanes of four float4s each, so a warp
// works on four positions at once with two shuffle levels less, and at batch 1 each warp
// finishes its share of a ~20-position split in one iteration. H200, batch-1 decode step:
// 4.634 ms with 8 lanes, 4.67 with 16, 4.77 with 32 (docs/GPU.md, tuning log).
// FLASHDLLM_ATTN_LANES=8|16|32 overrides (tuning knob, read once).
int lanes_for(int head_dim, int gm) {
  int lanes = 1;
  while (lanes < head_dim / 4 && lanes < 32) lanes *= 2;
  if (head_dim == 128 && gm == 4) lanes = 8;
  static const int forced = [] {
    const char* e = std::getenv("FLASHDLLM_ATTN_LANES");
    return e ? std::atoi(e) : 0;
  }();
  if ((forced == 8 || forced == 16 || forced == 32) && head_dim == 128 && gm == 4) lanes = forced;
  return lanes;
}

// Launches the per-token kernel with CH float4s per lane; `lanes` lanes must cover the head
// (a kernel with too few chunks would read a part of q, k and v and leave the merge reading
// unwritten shared memory), which is checked here rather than trusted to the caller.
template <typename KvT, int CH, int GM, int U>
void launch_partial_kv(const AttentionArgs& a, const AttentionMasks& masks, dim3 grid, size_t smem, int lanes,
                       cudaStream_t stream) {
  if (masks.any())
    launch_pdl(attn_partial_kernel<KvT, CH, GM, U, true>, grid, dim3(kThreads), smem, stream, with_masks(a, masks),
               lanes);
  else
    launch_pdl(attn_partial_kernel<KvT, CH, GM, U, false>, grid, dim3(kThreads), smem, stream, a, lanes);
}

template <int CH, int GM, int U>
void launch_partial(const AttentionArgs& a, const AttentionMasks& masks, dim3 grid, size_t smem, int lanes,
                    cudaStream_t stream) {
  if (CH * lanes * 4 < a.kv.head_dim)
    throw CudaError("paged_attention: " + std::to_string(lanes) + " lanes x " + std::to_string(CH) +
                    " float4s do not cover head_dim " + std::to_string(a.kv.head_dim));
  switch (a.kv.dtype) {
    case KvDtype::F32: return launch_partial_kv<float, CH, GM, U>(a, masks, grid, smem, lanes, stream);
    case KvDtype::F16: return launch_partial_kv<__half, CH, GM, U>(a, masks, grid, smem, lanes, stream);
    case KvDtype::BF16: return launch_partial_kv<__nv_bfloat16, CH, GM, U>(a, masks, grid, smem, lanes, stream);
  }
}

}  // namespace

int attention_splits(int n_tokens, int n_head, int n_head_kv, int n_sm, int max_ctx) {
  const int group = n_head / n_head_kv;
  const int64_t base = int64_t(n_tokens) * n_head_kv * ((group + kGMax - 1) / kGMax);
  // Enough blocks to fill the GPU twice, and chunks of at most ~128 positions (a block's
  // four warps then walk <= 32 positions each), but not under ~32 positions; rounded up to a
  // power of two, so a growing context changes it (and re-captures a decode graph) only at
  // doublings.
  int64_t want = std::max<int64_t>((2 * int64_t(n_sm) + base - 1) / base, (int64_t(max_ctx) + 127) / 128);
  want = std::min<int64_t>({want, (int64_t(max_ctx) + 31) / 32, 256});  // >= ~32 positions per chunk
  int splits = 1;
  while (splits < want) splits *= 2;
  static const int forced = [] {  // FLASHDLLM_ATTN_SPLITS=N: tuning knob, read once
    const char* e = std::getenv("FLASHDLLM_ATTN_SPLITS");
    return e ? std::clamp(std::atoi(e), 0, 256) : 0;
  }();
  return forced > 0 ? forced : splits;
}

size_t attention_partial_floats(int n_tokens, int n_head, int head_dim, int n_splits) {
  return size_t(n_tokens) * n_head * n_splits * (head_dim + 2);
}

bool attention_tiles_supported(int head_dim, int n_head, int n_head_kv) {
  return (head_dim == 64 || head_dim == 128) && n_head % n_head_kv == 0 && n_head / n_head_kv <= kTileRows;
}

int attention_tile_splits(int n_tiles, int n_head_kv, int n_sm, int max_ctx) {
  // About four blocks per multiprocessor (two fit at a time), shares of >= 2 chunks.
  const int64_t want = std::min<int64_t>((4 * int64_t(n_sm) + int64_t(n_tiles) * n_head_kv - 1) /
                                             (int64_t(n_tiles) * n_head_kv),
                                         (int64_t(max_ctx) + 2 * kChunk - 1) / (2 * kChunk));
  return int(std::clamp<int64_t>(want, 1, 64));
}

int attention_invariant_splits(int max_ctx) {
  constexpr int share = kInvariantShareChunks * 64;
  return std::max(1, (max_ctx + share - 1) / share);
}

bool attention_invariant_chunk_partials(const AttentionArgs& a) {
  return a.share_chunks > 0 && a.tensor_cores && a.tile_starts != nullptr && a.max_tile_rows > 0 &&
         a.max_tile_rows <= 16;
}

int attention_tiles(const int32_t* seqs, const int32_t* positions, int n, int n_head, int n_head_kv,
                    int32_t* starts) {
  const int max_tokens = kTileRows / (n_head / n_head_kv);
  int n_tiles = 0;
  for (int t = 0; t < n; ++t) {
    const bool extends = t > 0 && seqs[t] == seqs[t - 1] && positions[t] == positions[t - 1] + 1 &&
                         t - starts[n_tiles - 1] < max_tokens;
    if (!extends) starts[n_tiles++] = t;
  }
  starts[n_tiles] = n;
  return n_tiles;
}

void paged_attention(const AttentionArgs& a, cudaStream_t stream, const AttentionMasks& masks) {
  if (a.n_tokens <= 0) return;
  const int hd = a.kv.head_dim;
  if (a.share_chunks > 0 && (a.tile_starts == nullptr || !a.tensor_cores))
    throw CudaError("paged_attention: fixed context shares (share_chunks) need tensor-core tiles");
  if (a.tile_starts) {
    if (masks.softcap > 0) throw CudaError("paged_attention: soft-capped scores run the per-token kernel (no tiles)");
    if (!attention_tiles_supported(hd, a.n_head, a.kv.n_head_kv))
      throw CudaError("paged_attention: tiles need head_dim 64 or 128 and at most 128 query heads per kv head");
    if (a.tensor_cores)
      attention_tiles_tc(a, stream, masks);
    else if (a.kv.dtype != KvDtype::F32)  // the fp32 tiles read fp32 K/V only
      throw CudaError(std::string("paged_attention: fp32 tiles over a KV cache of ") + kv_dtype_name(a.kv.dtype) +
                      " (set tensor_cores)");
    else if (hd == 64)
      masks.any() ? launch_tiles<64, true>(with_masks(a, masks), stream) : launch_tiles<64, false>(a, stream);
    else
      masks.any() ? launch_tiles<128, true>(with_masks(a, masks), stream) : launch_tiles<128, false>(a, stream);
    if (attention_invariant_chunk_partials(a)) {
      const size_t weights = size_t(a.n_splits + 1) / 2 * 2 * sizeof(float);
      const size_t staged = weights + size_t(fold_stage_floats(a.n_splits, a.share_chunks, hd)) * sizeof(float);
      const bool stage = staged <= kFoldStageMaxBytes;
      launch_pdl(attn_fold_combine_kernel, dim3(unsigned(a.n_tokens * a.n_head)), dim3(combine_threads(hd)),
                 stage ? staged : weights, stream, a.partial, a.out, a.n_splits, a.share_chunks, hd, stage);
    } else if (a.n_splits > 1 || a.share_chunks > 0)
      launch_pdl(attn_combine_kernel, dim3(unsigned(a.n_tokens * a.n_head)), dim3(combine_threads(hd)),
                 size_t(a.n_splits) * sizeof(float), stream, static_cast<const float*>(a.partial), a.out, a.n_splits, hd);
    return;
  }
  if (hd % 4 != 0 || hd > 256 || hd <= 0)
    throw CudaError("paged_attention: head_dim " + std::to_string(hd) + " must be a positive multiple of 4, at most 256");
  if (a.n_head % a.kv.n_head_kv != 0) throw CudaError("paged_attention: n_head must be a multiple of n_head_kv");
  const int group = a.n_head / a.kv.n_head_kv;
  // Query heads per block: the group size rounded up to 1, 2, 4 or 8 (larger groups take
  // several blocks), so registers are not spent on heads that do not exist.
  const int gm = group <= 1 ? 1 : group <= 2 ? 2 : group <= 4 ? 4 : 8;
  const int lanes = lanes_for(hd, gm);
  const dim3 grid(unsigned(a.n_splits), unsigned(a.kv.n_head_kv * ((group + gm - 1) / gm)), unsigned(a.n_tokens));
  const size_t smem = size_t(kThreads / 32) * (32 / lanes) * gm * (hd + 4) * sizeof(float);
  const bool wide = hd / 4 > 32;
  switch (gm) {
    case 1:
      if (wide)
        launch_partial<2, 1, 4>(a, masks, grid, smem, lanes, stream);
      else
        launch_partial<1, 1, 4>(a, masks, grid, smem, lanes, stream);
      break;
    case 2:
      if (wide)
        launch_partial<2, 2, 4>(a, masks, grid, smem, lanes, stream);
      else
        launch_partial<1, 2, 4>(a, masks, grid, smem, lanes, stream);
      break;
    case 4:
      if (lanes == 8)
        launch_partial<4, 4, 2>(a, masks, grid, smem, lanes, stream);
      else if (lanes == 16)
        launch_partial<2, 4, 4>(a, masks, grid, smem, lanes, stream);
      else if (wide)
        launch_partial<2, 4, 2>(a, masks, grid, smem, lanes, stream);
      else
        launch_partial<1, 4, 4>(a, masks, grid, smem, lanes, stream);
      break;
    default:
      if (wide)
        launch_partial<2, 8, 2>(a, masks, grid, smem, lanes, stream);
      else
        launch_partial<1, 8, 2>(a, masks, grid, smem, lanes, stream);
      break;
  }
  launch_pdl(attn_combine_kernel, dim3(unsigned(a.n_tokens * a.n_head)), dim3(combine_threads(hd)),
             size_t(a.n_splits) * sizeof(float), stream,
             static_cast<const float*>(a.partial), a.out, a.n_splits, hd);
}

}  // namespace fdl::cuda
