// The attention half of a batch-1 decode layer in one kernel (contract in kernels.h):
//   RMSNorm -> QKV projection -> RoPE + K/V store -> attention over the context -> merge of
//   the context splits -> wo projection.
// As separate kernels this is four launches (gemv_norm_rope_qkv, the attention partials, their
// combine, wo), and each boundary costs ~5-7 µs on an H200 while HBM idles: the next grid can
// only start once the previous one has drained, and every kernel here is one short wave
// (docs/GPU.md, tuning log). Here one block per SM stays resident for the whole half-layer and
// the phases hand over through counters instead of kernel boundaries:
//   - blocks are grouped by KV head: group g (bpk = sub-groups x bpg blocks) projects exactly
//     the q, k and v rows that attention over KV head g needs, so the first hand-off (q/k/v of g
//     stored) and the second (all context splits of g computed) only wait for the group's
//     blocks; a sub-group (at most 4 query heads: the registers of GM) splits the context over
//     its bpg blocks;
//   - only the wo projection needs every head, behind one grid-wide hand-off (grid <= SMs, one
//     block per SM: all blocks are co-resident, so spinning on a counter cannot deadlock).
// Counters are zeroed by the caller before the launch (one memset per step for all layers).
// Data written during the kernel by other blocks (q, the new K/V slot, the split partials,
// the attention output) is read through L2 (ld.global.cg), never through a possibly stale L1.
// Arithmetic: the projections are gemv.cu's loop (fp32 accumulate, same lane order), the norm
// gemv_fused.cu's (the fp64 sum over 512 threads instead of 256), the attention an online
// softmax like the per-token kernel's but in base 2, rescaled once per step of kU positions,
// with other split points (and, for groups of 4 query heads, the scores' lane sums in another
// order): values agree
// with the separate kernels to fp32 rounding (tests/gpu/decode_block_test.cpp).
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/decode_block.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kv_elem.cuh"
#include "backend/cuda/launch.h"

#include <algorithm>
#include <string>
#include <type_traits>

namespace fdl::cuda {
namespace {

using namespace block;
constexpr int kUnroll = 8;
constexpr int kMaxGroupBlocks = 16;  // context splits per sub-group (blocks_per_group)
constexpr int kU = 4;                // positions per warp in flight in the attention phase

/// Head dimensions a warp's lanes hold per float4 each lane keeps: lane L holds dims
/// hv * kLaneDims + 4L .. +3 of vector hv (lanes past the head hold zeros).
constexpr int kLaneDims = 128;

/// A q or k head held in HV float4s per lane (above): RMSNorm over the head (rope_qkv_store's
/// arithmetic: fp64 sum of the fp32 squares, scale 1/sqrtf(mean + eps), (x·scale)·w), then
/// RoPE on its pairs. Every lane of the warp must call it (the sum is a warp reduction).
template <int HV>
__device__ __forceinline__ void norm_rope(float4 (&x)[HV], const float* w, float eps, const float* cos_sin,
                                          int rope_dim, int hd, int lane) {
  double sum = 0.0;
#pragma unroll
  for (int hv = 0; hv < HV; ++hv)
    if (hv * kLaneDims + lane * 4 < hd)
      sum += double(__fmul_rn(x[hv].x, x[hv].x)) + double(__fmul_rn(x[hv].y, x[hv].y)) +
             double(__fmul_rn(x[hv].z, x[hv].z)) + double(__fmul_rn(x[hv].w, x[hv].w));
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  const float scale = 1.0f / sqrtf(__fadd_rn(float(sum / double(hd)), eps));
#pragma unroll
  for (int hv = 0; hv < HV; ++hv) {
    const int e = hv * kLaneDims + lane * 4;
    if (e >= hd) continue;
    float v[4] = {x[hv].x, x[hv].y, x[hv].z, x[hv].w};
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = __fmul_rn(__fmul_rn(v[k], scale), w[e + k]);
#pragma unroll
    for (int k = 0; k < 4; k += 2)
      if (e + k < rope_dim) {
        const float c = cos_sin[e + k], sn = cos_sin[e + k + 1];
        const float y0 = __fsub_rn(__fmul_rn(v[k], c), __fmul_rn(v[k + 1], sn));
        const float y1 = __fadd_rn(__fmul_rn(v[k], sn), __fmul_rn(v[k + 1], c));
        v[k] = y0, v[k + 1] = y1;
      }
    x[hv] = make_float4(v[0], v[1], v[2], v[3]);
  }
}

__device__ __forceinline__ float dot4(float4 a, float4 b) { return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w; }

/// The kernel's plans. kPlain and kQkNorm (per-head Q/K norms, compiled in) take head_dim up
/// to 128, one float4 per lane. kWide takes head_dim up to 256 (two float4s per lane; with an
/// fp32 cache half the positions per step; at most 2 query heads per register group) and the
/// Gemma plan's options
/// at run time: a post-norm of the norm's addend (NormIn::add_w), soft-capped scores, per-head
/// Q/K norms. Compiled separately so the plain kernel keeps its registers.
enum BlockPlan : int { kPlain = 0, kQkNorm = 1, kWide = 2 };

/// Row of the fused QKV matrix for local row `lr` of KV group g: the group's G q heads, then
/// its k head, then its v head.
__device__ __forceinline__ int64_t qkv_row(int lr, int g, int G, int hd, int q_dim, int kv_dim) {
  if (lr < G * hd) return int64_t(g) * G * hd + lr;
  if (lr < (G + 1) * hd) return q_dim + int64_t(g) * hd + (lr - G * hd);
  return q_dim + kv_dim + int64_t(g) * hd + (lr - (G + 1) * hd);
}

// kTrace: the phase stamps compiled in (a.trace set); without them the untraced kernel carries
// no per-stamp check (those checks cost registers at the 128-register cap: spills).
// KV16: the KV cache holds WT's 16-bit type (a 16-bit cache matches the weights: CudaModel);
// else fp32. kPlan: a BlockPlan.
template <typename WT, int GM, bool kTrace, bool KV16, int kPlan>
__global__ void __launch_bounds__(kThreads, 1) attention_block_kernel(AttentionBlockArgs a) {
  using KvT = std::conditional_t<KV16, WT, float>;
  constexpr int HV = kPlan == kWide ? 2 : 1;  // float4s per lane: head_dim up to HV * kLaneDims
  // Positions per warp per step: kU, or for the wide plan's two float4s per lane 2 with an fp32
  // cache (the same K/V registers) and 3 with a 16-bit one (its raw K/V take half the
  // registers; 4 would spill).
  constexpr int U = HV == 1 ? kU : KV16 ? 3 : 2;
  extern __shared__ float4 smem4[];
  auto stamp = [&](int event) {
    if constexpr (kTrace) block::stamp(a.trace, event);
  };
  launch_dependents();
  stamp(kAttnEntry);
  constexpr int kVec = Widen<WT>::kVec;
  const KvLayerView& kv = a.kv;
  const int cols = a.cols, hd = kv.head_dim, n_kv = kv.n_head_kv, G = a.n_head / n_kv;
  const int q_dim = a.n_head * hd, kv_dim = n_kv * hd;
  // KV head g's blocks: n_sub sub-groups of bpg blocks; sub-group sg attends for query heads
  // h0 .. h0 + Gc - 1 (at most 4: the registers of GM) over context split r.
  const int n_sub = (G + 3) / 4, Gs = (G + n_sub - 1) / n_sub;  // attention_subgroups()
  const int bpg = a.blocks_per_group, bpk = bpg * n_sub;
  const int g = blockIdx.x / bpk, kb = blockIdx.x % bpk, sg = kb / bpg, r = kb % bpg;
  const int h0 = g * G + sg * Gs, Gc = min(Gs, G - sg * Gs);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float* xs = reinterpret_cast<float*>(smem4);        // [max(cols, q_dim)]: the normalized row, then wo's input
  float* mrg = xs + ((max(cols, q_dim) + 3) & ~3);    // [kWarps][GM][hd + 4] warp states
  float* ws = mrg + kWarps * GM * (hd + 4);           // [cols] the norm weight
  float* res = ws + cols;                             // [chunk] this block's q/k/v values

  // This block's rows of KV head g's group — all G query heads, k and v, dealt over the bpk
  // blocks of every sub-group (an even count, so RoPE pairs stay in one block).
  const int rows_g = (G + 2) * hd;
  int chunk = (rows_g + bpk - 1) / bpk;
  chunk += chunk & 1;
  const int lr0 = min(rows_g, kb * chunk), lr1 = min(rows_g, lr0 + chunk);
  const int nvec = cols / kVec;
  const WT* Wqkv = static_cast<const WT*>(a.wqkv);
  auto qkv_ptr = [&](int lr) {
    return reinterpret_cast<const uint4*>(Wqkv + qkv_row(lr, g, G, hd, q_dim, kv_dim) * cols);
  };
  uint4 w[kUnroll];
  // First weight loads before waiting for the previous kernel: weights depend on nothing.
  if (lr0 + warp < lr1) load_first<kUnroll>(qkv_ptr(lr0 + warp), w, nvec, lane);
  norm_weight_prefetch(a.in, cols, ws);
  // This block's share of the context, known before the wait (the step's inputs were copied
  // before the step's first kernel): its K/V vectors, written by earlier steps, start moving
  // into L2 now; only the newest position's comes from this kernel (not prefetched).
  const int pos = a.positions[0];
  const int lo = a.window > 0 ? max(0, pos - a.window + 1) : 0;  // a sliding window's first position
  const int ctx = pos + 1, per = (ctx - lo + bpg - 1) / bpg;
  const int begin = min(ctx, lo + r * per), end = min(ctx, begin + per);
  const int32_t* table = a.tables + a.table_off[0];
  auto kv_at = [&](int j) { return kv_ptr<KvT>(kv, table[j / kv.block_size], j % kv.block_size, int64_t(g) * hd); };
  for (int i = threadIdx.x; i < 2 * (min(end, pos) - begin); i += kThreads) {
    const int j = begin + i / 2;
    prefetch_l2(kv_at(j) + (i & 1) * int64_t(kv.block_size) * kv_dim, unsigned(hd * sizeof(KvT)));
  }
  grid_dependency_wait();
  stamp(kAttnAfterPdlWait);

  // 1. v = x + add, RMSNorm into shared memory (block 0 writes v: the residual stream).
  norm_to_smem<kThreads, kPlan == kWide>(a.in, cols, ws, xs);
  stamp(kAttnNormDone);

  // 2. q/k/v rows of group g: warps take the block's rows round-robin.
  for (int lr = lr0 + warp; lr < lr1; lr += kWarps) {
    const float acc =
        dot_row<WT, kUnroll>(qkv_ptr(lr), w, xs, nvec, lane, lr + kWarps < lr1 ? qkv_ptr(lr + kWarps) : nullptr);
    if (lane == 0) res[lr - lr0] = acc;
  }
  __syncthreads();
  bool has[HV];  // this lane holds dims of vector hv
#pragma unroll
  for (int hv = 0; hv < HV; ++hv) has[hv] = hv * kLaneDims + lane * 4 < hd;
  auto lane_off = [&](int hv) { return hv * kLaneDims + lane * 4; };
  // The K rows of this warp's first attention positions that earlier steps wrote (in L2
  // since the prefetch above; their table entries in L1): loaded now, so that round trip
  // overlaps RoPE and the group hand-off instead of following it (their V rows go out with q,
  // after it; the newest position's K/V are written by the group, also loaded after it).
  // (Raw: as loaded, widened where used: a 16-bit cache's K/V take half the registers.)
  using E = KvElem<KvT>;
  using Raw = typename E::Raw;
  Raw k[U][HV], v[U][HV];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int j = begin + warp + u * kWarps;
#pragma unroll
    for (int hv = 0; hv < HV; ++hv) {
      k[u][hv] = E::zero();
      if (j < end && j < pos && has[hv]) k[u][hv] = E::load_raw_cg(kv_at(j) + lane_off(hv));
    }
  }
  // RoPE on (q, k) pairs and the stores (gemv_fused.cu's epilogue).
  KvT* k_dst = kv_ptr<KvT>(kv, a.dst_block[0], pos % kv.block_size, 0);
  // Per-head Q/K norms: compiled in (kQkNorm), or the wide plan's run-time option.
  const bool qk_norm = kPlan == kQkNorm || (kPlan == kWide && a.extras.q_norm != nullptr);
  for (int i = threadIdx.x; 2 * i < lr1 - lr0; i += kThreads) {
    const int lr = lr0 + 2 * i;
    const int ri = int(qkv_row(lr, g, G, hd, q_dim, kv_dim));
    float x0 = res[2 * i], x1 = res[2 * i + 1];
    if (a.extras.bias) {  // rope_qkv_store's order: the bias before the norm and RoPE
      x0 = __fadd_rn(x0, a.extras.bias[ri]);
      x1 = __fadd_rn(x1, a.extras.bias[ri + 1]);
    }
    if (ri >= q_dim + kv_dim) {
      KvElem<KvT>::store2(k_dst + int64_t(kv.block_size) * kv_dim + (ri - q_dim - kv_dim), x0, x1);
    } else if (qk_norm) {
      // A head's norm needs all of its rows, spread over the group's blocks: q and the new k
      // go out raw; the norm and RoPE run after the hand-off (norm_rope4).
      float* dst = ri < q_dim ? a.q_out + ri : a.k_new + (ri - q_dim);
      dst[0] = x0;
      dst[1] = x1;
    } else {
      const int e = ri % hd;
      float y0 = x0, y1 = x1;
      if (e < a.rope_dim) {
        const float c = a.cos_sin[e], sn = a.cos_sin[e + 1];
        y0 = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, sn));
        y1 = __fadd_rn(__fmul_rn(x0, sn), __fmul_rn(x1, c));
      }
      if (ri < q_dim) {
        a.q_out[ri] = y0;
        a.q_out[ri + 1] = y1;
      } else {
        KvElem<KvT>::store2(k_dst + (ri - q_dim), y0, y1);
      }
    }
  }
  arrive(a.sync + g);
  stamp(kAttnQkvDone);
  wait_for(a.sync + g, unsigned(bpk));
  stamp(kAttnQkvHandedOff);

  // 3. Attention of the sub-group's Gc query heads over split r of the context [0, pos]: a warp
  //    takes U positions (kWarps apart) per step, 32 lanes x HV float4s cover head_dim <=
  //    HV x 128; an online softmax per head, U positions loaded before any is used.
  constexpr float kLog2e = 1.4426950408889634f;
  const float scale2 = a.scale * kLog2e;  // scores in base 2: times log2(e)
  // A raw dot product as a base-2 score; soft-capped (the wide plan) as the per-token kernel
  // caps it: softcap * tanh(s * scale / softcap).
  auto score = [&](float t) {
    if constexpr (kPlan == kWide)
      if (a.softcap > 0) return __fmul_rn(__fmul_rn(a.softcap, tanhf(__fdiv_rn(t * a.scale, a.softcap))), kLog2e);
    return t * scale2;
  };
  float4 q[GM][HV];
  float m[GM], l[GM];
  float4 acc[GM][HV];
#pragma unroll
  for (int gi = 0; gi < GM; ++gi) {
#pragma unroll
    for (int hv = 0; hv < HV; ++hv) {
      q[gi][hv] = (gi < Gc && has[hv]) ? ldcg4(a.q_out + int64_t(h0 + gi) * hd + lane_off(hv))
                                       : make_float4(0.f, 0.f, 0.f, 0.f);
      acc[gi][hv] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
    if (qk_norm && gi < Gc) norm_rope<HV>(q[gi], a.extras.q_norm, a.extras.eps, a.cos_sin, a.rope_dim, hd, lane);
    m[gi] = -INFINITY, l[gi] = 0.f;
  }
  // One step of kU positions per warp: all scores first, then one softmax update per head
  // (one rescale of the running state per step, not per position). The softmax runs in base 2
  // (scores scaled by log2(e) with the 1/sqrt(hd) scale; exp2f is one MUFU op, expf adds a
  // range reduction): the step is bound by its instruction count, 16 warps x (kU x GM) scores
  // per SM (docs/GPU.md, tuning log, "fewer instructions per score"). Every running max m of
  // this kernel, its partials included, is in that base.
  auto attend = [&](const Raw(&kr)[U][HV], const Raw(&vr)[U][HV], int j0) {
    float s[U][GM];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float4 kk_u[HV];
#pragma unroll
      for (int hv = 0; hv < HV; ++hv) kk_u[hv] = E::widen(kr[u][hv]);
      if constexpr (GM == 4) {
        static_assert(HV == 1, "groups of 4 query heads hold one float4 per lane");
        // The four heads' 32-lane sums in 10 shuffles instead of 20: halves exchanged at
        // distances 16 and 8 leave lane L one head's partial sum (head 2 bit4 + bit3), summed
        // over the rest at 4, 2, 1, then each head's score is read from its owner lane.
        float d[4];
#pragma unroll
        for (int gi = 0; gi < 4; ++gi) d[gi] = dot4(q[gi][0], kk_u[0]);
        const bool b4 = lane & 16, b3 = lane & 8;
        float k0 = b4 ? d[2] : d[0], k1 = b4 ? d[3] : d[1];
        k0 += __shfl_xor_sync(0xffffffffu, b4 ? d[0] : d[2], 16);
        k1 += __shfl_xor_sync(0xffffffffu, b4 ? d[1] : d[3], 16);
        float z = b3 ? k1 : k0;
        z += __shfl_xor_sync(0xffffffffu, b3 ? k0 : k1, 8);
        z += __shfl_xor_sync(0xffffffffu, z, 4);
        z += __shfl_xor_sync(0xffffffffu, z, 2);
        z += __shfl_xor_sync(0xffffffffu, z, 1);
#pragma unroll
        for (int gi = 0; gi < 4; ++gi) s[u][gi] = score(__shfl_sync(0xffffffffu, z, (gi >> 1) * 16 + (gi & 1) * 8));
      } else {
#pragma unroll
        for (int gi = 0; gi < GM; ++gi) {
          float t = dot4(q[gi][0], kk_u[0]);
#pragma unroll
          for (int hv = 1; hv < HV; ++hv) t += dot4(q[gi][hv], kk_u[hv]);
          for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
          s[u][gi] = score(t);
        }
      }
    }
#pragma unroll
    for (int gi = 0; gi < GM; ++gi) {
      float m_new = m[gi];
#pragma unroll
      for (int u = 0; u < U; ++u) m_new = j0 + u * kWarps < end ? fmaxf(m_new, s[u][gi]) : m_new;
      const float corr = exp2f(m[gi] - m_new);  // m = -inf before the first position: 0
      float l_add = 0.f;
      float4 a_add[HV];
#pragma unroll
      for (int hv = 0; hv < HV; ++hv) a_add[hv] = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const float p = j0 + u * kWarps < end ? exp2f(s[u][gi] - m_new) : 0.f;
        l_add += p;
#pragma unroll
        for (int hv = 0; hv < HV; ++hv) {
          const float4 vv_u = E::widen(vr[u][hv]);
          a_add[hv] = make_float4(a_add[hv].x + vv_u.x * p, a_add[hv].y + vv_u.y * p, a_add[hv].z + vv_u.z * p,
                                  a_add[hv].w + vv_u.w * p);
        }
      }
      l[gi] = l[gi] * corr + l_add;
#pragma unroll
      for (int hv = 0; hv < HV; ++hv)
        acc[gi][hv] = make_float4(acc[gi][hv].x * corr + a_add[hv].x, acc[gi][hv].y * corr + a_add[hv].y,
                                  acc[gi][hv].z * corr + a_add[hv].z, acc[gi][hv].w * corr + a_add[hv].w);
      m[gi] = m_new;
    }
  };
  // K of positions before `pos` is already in kk when k_loaded.
  auto load_kv = [&](Raw(&kk)[U][HV], Raw(&vv)[U][HV], int j0, bool k_loaded) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int j = j0 + u * kWarps;
      if (qk_norm && j == pos && j < end) {
        // The newest K: normalized and rotated here (by the one warp, in each sub-group, of the
        // block whose split holds pos: the same inputs and arithmetic, so sub-groups store the
        // same bytes), stored, then read back like any other position.
        float4 kn[HV];
#pragma unroll
        for (int hv = 0; hv < HV; ++hv)
          kn[hv] = has[hv] ? ldcg4(a.k_new + int64_t(g) * hd + lane_off(hv)) : make_float4(0.f, 0.f, 0.f, 0.f);
        norm_rope<HV>(kn, a.extras.k_norm, a.extras.eps, a.cos_sin, a.rope_dim, hd, lane);
#pragma unroll
        for (int hv = 0; hv < HV; ++hv)
          if (has[hv]) {
            KvT* kw = kv_ptr<KvT>(kv, a.dst_block[0], pos % kv.block_size, int64_t(g) * hd) + lane_off(hv);
            E::store2(kw, kn[hv].x, kn[hv].y);
            E::store2(kw + 2, kn[hv].z, kn[hv].w);
          }
      }
#pragma unroll
      for (int hv = 0; hv < HV; ++hv) {
        const bool live = j < end && has[hv];
        const KvT* kp = live ? kv_at(j) + lane_off(hv) : nullptr;
        if (!k_loaded || j >= pos) kk[u][hv] = live ? E::load_raw_cg(kp) : E::zero();
        vv[u][hv] = live ? E::load_raw_cg(kp + int64_t(kv.block_size) * kv_dim) : E::zero();
      }
    }
  };
  if (begin + warp < end) {  // the first step: K of earlier positions loaded before the hand-off
    load_kv(k, v, begin + warp, true);
    attend(k, v, begin + warp);
  }
  for (int j0 = begin + warp + U * kWarps; j0 < end; j0 += U * kWarps) {
    Raw kk[U][HV], vv[U][HV];
    load_kv(kk, vv, j0, false);
    attend(kk, vv, j0);
  }
  // Merge the warps' states in shared memory; one partial (acc, m, l) per head and split.
  const int rec = hd + 4;
#pragma unroll
  for (int gi = 0; gi < GM; ++gi) {
    if (gi >= Gc) break;
    float* rp = mrg + (warp * GM + gi) * rec;
#pragma unroll
    for (int hv = 0; hv < HV; ++hv)
      if (has[hv]) *reinterpret_cast<float4*>(rp + lane_off(hv)) = acc[gi][hv];
    if (lane == 0) rp[hd] = m[gi], rp[hd + 1] = l[gi];
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < Gc * hd; idx += kThreads) {
    const int gi = idx / hd, d = idx % hd;
    float mx = -INFINITY;
    for (int s = 0; s < kWarps; ++s) mx = fmaxf(mx, mrg[(s * GM + gi) * rec + hd]);
    float o = 0.f, lsum = 0.f;
    if (mx != -INFINITY)
      for (int s = 0; s < kWarps; ++s) {
        const float* rp = mrg + (s * GM + gi) * rec;
        const float wgt = exp2f(rp[hd] - mx);  // 0 for warps that saw no position (m = -inf)
        o += rp[d] * wgt;
        lsum += rp[hd + 1] * wgt;
      }
    float* out = a.partial + (int64_t(h0 + gi) * bpg + r) * (hd + 2);
    out[d] = o;
    if (d == 0) out[hd] = mx, out[hd + 1] = lsum;
  }
  arrive(a.sync + g);
  stamp(kAttnPartialDone);
  wait_for(a.sync + g, unsigned(2 * bpk));
  stamp(kAttnPartialsHandedOff);

  // 4. Merge the sub-group's splits: block r finalizes its share of the Gc * hd outputs. A
  //    half-warp per output, one lane per split: every partial is loaded at once (one L2
  //    round trip, not one per split), then reduced with shuffles.
  {
    const int per_out = (Gc * hd + bpg - 1) / bpg;
    const int o0 = r * per_out, o1 = min(Gc * hd, o0 + per_out);
    const int s = threadIdx.x % kMaxGroupBlocks;
    for (int idx = o0 + threadIdx.x / kMaxGroupBlocks; idx - (threadIdx.x / kMaxGroupBlocks) < o1;
         idx += kThreads / kMaxGroupBlocks) {
      const bool live = idx < o1 && s < bpg;
      const int gi = live ? idx / hd : 0, d = live ? idx % hd : 0;
      const float* p = a.partial + (int64_t(h0 + gi) * bpg + s) * (hd + 2);
      const float m_s = live ? __ldcg(p + hd) : -INFINITY;
      const float l_s = live ? __ldcg(p + hd + 1) : 0.f;
      const float o_s = live ? __ldcg(p + d) : 0.f;
      float mx = m_s;
      for (int o = kMaxGroupBlocks / 2; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      const float wgt = m_s == -INFINITY ? 0.f : exp2f(m_s - mx);  // -inf: an empty split
      float o_sum = o_s * wgt, l_sum = l_s * wgt;
      for (int o = kMaxGroupBlocks / 2; o > 0; o >>= 1) {
        o_sum += __shfl_xor_sync(0xffffffffu, o_sum, o);
        l_sum += __shfl_xor_sync(0xffffffffu, l_sum, o);
      }
      if (idx < o1 && s == 0) a.attn_out[int64_t(h0 + gi) * hd + d] = o_sum / l_sum;
    }
  }

  // 5. wo: every block takes a contiguous share of its rows; each row needs every head, so
  //    this waits for all blocks. The first weight loads are issued between the arrival and
  //    the wait.
  const WT* Wo = static_cast<const WT*>(a.wo);
  const int wo_cols = q_dim, wo_nvec = wo_cols / kVec;
  const int64_t wchunk = (a.wo_rows + gridDim.x - 1) / gridDim.x;
  const int64_t wr0 = ::min(a.wo_rows, int64_t(blockIdx.x) * wchunk), wr1 = ::min(a.wo_rows, wr0 + wchunk);
  auto wo_ptr = [&](int64_t row) { return reinterpret_cast<const uint4*>(Wo + row * wo_cols); };
  arrive(a.sync + n_kv);
  stamp(kAttnMergeDone);
  if (wr0 + warp < wr1) load_first<kUnroll>(wo_ptr(wr0 + warp), w, wo_nvec, lane);
  wait_for(a.sync + n_kv, gridDim.x);
  stamp(kAttnOutHandedOff);
  // The attention output (written by every block) into shared memory: every warp reads it
  // once per row, and through L2 that would be as many bytes as the weights.
  stage_to_smem(a.attn_out, q_dim, xs);
  for (int64_t row = wr0 + warp; row < wr1; row += kWarps) {
    const float acc_o =
        dot_row<WT, kUnroll>(wo_ptr(row), w, xs, wo_nvec, lane, row + kWarps < wr1 ? wo_ptr(row + kWarps) : nullptr);
    if (lane == 0) a.y[row] = acc_o;
  }
  if constexpr (kTrace) {
    __syncthreads();
    stamp(kAttnEnd);
  }
}

size_t smem_bytes(int cols, int gm, int hd, int blocks_per_group, int n_head_kv, int n_head) {
  const int group = n_head / n_head_kv, rows_g = (group + 2) * hd;
  const int bpk = blocks_per_group * attention_subgroups(n_head, n_head_kv);
  int chunk = (rows_g + bpk - 1) / bpk;
  chunk += chunk & 1;
  return (size_t((std::max(cols, n_head * hd) + 3) & ~3) + size_t(kWarps) * gm * (hd + 4) + size_t(cols) +
          size_t(chunk)) *
         sizeof(float);
}

int gm_for(int group) { return group <= 1 ? 1 : group <= 2 ? 2 : 4; }
/// The registers' query heads for a KV head of n_head / n_head_kv of them, in sub-groups.
int gm_for(int n_head, int n_head_kv) {
  const int group = n_head / n_head_kv, n_sub = attention_subgroups(n_head, n_head_kv);
  return gm_for((group + n_sub - 1) / n_sub);
}

AttentionBlockFeatures features_of(const AttentionBlockArgs& a) {
  return AttentionBlockFeatures{a.extras.q_norm != nullptr, a.in.add_w != nullptr, a.softcap > 0};
}

/// The plan a layer's features need (BlockPlan).
int plan_for(int head_dim, const AttentionBlockFeatures& f) {
  if (head_dim > kLaneDims || f.post_norm || f.softcap) return kWide;
  return f.qk_norm ? kQkNorm : kPlain;
}

template <typename WT, int GM, bool KV16, int P>
auto* kernel_for(bool trace) {
  return trace ? attention_block_kernel<WT, GM, true, KV16, P> : attention_block_kernel<WT, GM, false, KV16, P>;
}

template <typename WT, int GM, bool KV16>
void launch_typed(const AttentionBlockArgs& a, size_t smem, cudaStream_t stream) {
  const int plan = plan_for(a.kv.head_dim, features_of(a));
  void (*kernel)(AttentionBlockArgs) = nullptr;  // every instantiation has this signature
  switch (plan) {
    case kPlain: kernel = kernel_for<WT, GM, KV16, kPlain>(a.trace); break;
    case kQkNorm: kernel = kernel_for<WT, GM, KV16, kQkNorm>(a.trace); break;
    default:
      if constexpr (GM <= 2) kernel = kernel_for<WT, GM, KV16, kWide>(a.trace);
  }
  if (kernel == nullptr)
    throw CudaError("decode_attention_block: the wide plan (head_dim > 128, post-norms or soft-capping) takes at most "
                    "2 query heads per KV head, not " + std::to_string(a.n_head / a.kv.n_head_kv));
  const int64_t blocks = int64_t(a.kv.n_head_kv) * attention_subgroups(a.n_head, a.kv.n_head_kv) * a.blocks_per_group;
  const int64_t fit = resident_blocks(reinterpret_cast<const void*>(kernel), smem);
  if (blocks > fit)  // the hand-offs would wait forever
    throw CudaError("decode_attention_block: " + std::to_string(blocks) + " blocks cannot be resident at once (" +
                    std::to_string(fit) + " fit)");
  launch_pdl(kernel, dim3(unsigned(blocks)), dim3(kThreads), smem, stream, a);
}

template <typename WT, bool KV16>
void launch_gm(const AttentionBlockArgs& a, size_t smem, cudaStream_t stream) {
  switch (gm_for(a.n_head, a.kv.n_head_kv)) {
    case 1: return launch_typed<WT, 1, KV16>(a, smem, stream);
    case 2: return launch_typed<WT, 2, KV16>(a, smem, stream);
    default: return launch_typed<WT, 4, KV16>(a, smem, stream);
  }
}

// Planning (attention_block_groups) sizes the grid for the untraced kernel of the layer's
// plan; a launch checks the instantiation it runs. 0: no such kernel (wide plans with groups
// of more than 2 query heads).
template <typename WT, int P>
int64_t capacity_of(int gm, size_t smem) {
  switch (gm) {
    case 1: return resident_blocks(reinterpret_cast<const void*>(attention_block_kernel<WT, 1, false, false, P>), smem);
    case 2: return resident_blocks(reinterpret_cast<const void*>(attention_block_kernel<WT, 2, false, false, P>), smem);
    default:
      if constexpr (P == kWide) return 0;
      else return resident_blocks(reinterpret_cast<const void*>(attention_block_kernel<WT, 4, false, false, P>), smem);
  }
}
template <typename WT>
int64_t capacity(int gm, size_t smem, int plan) {
  switch (plan) {
    case kPlain: return capacity_of<WT, kPlain>(gm, smem);
    case kQkNorm: return capacity_of<WT, kQkNorm>(gm, smem);
    default: return capacity_of<WT, kWide>(gm, smem);
  }
}

// The cache is fp32, or the weights' own 16-bit type (the kernel's KV16 instantiations). The
// bulk L2 prefetch of a position's K/V row needs 16-byte rows at 16-byte offsets: head_dim a
// multiple of 4 (fp32) or 8 (16-bit).
bool kv_type_ok(WType w, KvDtype kv, int head_dim) {
  if (kv == KvDtype::F32) return true;
  return head_dim % 8 == 0 && ((w == WType::F16 && kv == KvDtype::F16) || (w == WType::BF16 && kv == KvDtype::BF16));
}

bool matrix_ok(const DeviceMatrix& W) {
  return W.cols > 0 && (W.cols * int64_t(wtype_size(W.type))) % 16 == 0 && reinterpret_cast<uintptr_t>(W.data) % 16 == 0;
}

}  // namespace

int attention_block_groups(const DeviceMatrix& Wqkv, const DeviceMatrix& Wo, int n_head, const KvLayerView& kv,
                           int n_sm, const AttentionBlockFeatures& features) {
  if (Wqkv.quantized() || Wo.quantized()) return 0;  // 16- and 32-bit rows only
  const int hd = kv.head_dim, n_kv = kv.n_head_kv;
  // Query heads per KV head above 4 run in sub-groups of at most 4 (more would spill registers:
  // the 512-thread block caps them at 128); up to 16.
  if (n_kv <= 0 || n_head % n_kv != 0 || n_head / n_kv > 16) return 0;
  if (hd <= 0 || hd % 4 != 0 || hd > 2 * kLaneDims) return 0;
  const int plan = plan_for(hd, features);
  if (Wqkv.type != Wo.type || !matrix_ok(Wqkv) || !matrix_ok(Wo)) return 0;
  if (!kv_type_ok(Wqkv.type, kv.dtype, hd)) return 0;
  if (Wqkv.cols > 16384 || Wqkv.cols % 4 != 0) return 0;
  if (Wqkv.rows != int64_t(n_head + 2 * n_kv) * hd || Wo.cols != int64_t(n_head) * hd) return 0;
  const int n_sub = attention_subgroups(n_head, n_kv);
  const int bpg = std::min(kMaxGroupBlocks, n_sm / (n_kv * n_sub));
  if (bpg < 1) return 0;
  const int gm = gm_for(n_head, n_kv);
  const size_t smem = smem_bytes(int(Wqkv.cols), gm, hd, bpg, n_kv, n_head);
  int64_t fit = 0;
  switch (Wqkv.type) {
    case WType::F32: fit = capacity<float>(gm, smem, plan); break;
    case WType::F16: fit = capacity<__half>(gm, smem, plan); break;
    case WType::BF16: fit = capacity<__nv_bfloat16>(gm, smem, plan); break;
  }
  // Every block must be resident at once (they wait for each other).
  if (int64_t(bpg) * n_kv * n_sub > fit) return 0;
  return bpg;
}

size_t attention_block_partial_floats(int n_head, int head_dim, int blocks_per_group) {
  return size_t(n_head) * blocks_per_group * (head_dim + 2);
}

void decode_attention_block(const AttentionBlockArgs& a, cudaStream_t stream) {
  const int bpg = a.blocks_per_group;
  if (bpg < 1 || bpg > kMaxGroupBlocks)
    throw CudaError("decode_attention_block: blocks_per_group " + std::to_string(bpg) + " outside 1.." +
                    std::to_string(kMaxGroupBlocks) + " (use attention_block_groups)");
  if ((a.extras.q_norm == nullptr) != (a.extras.k_norm == nullptr) || (a.extras.q_norm && a.k_new == nullptr))
    throw CudaError("decode_attention_block: q_norm, k_norm and k_new must be set together");
  if (a.kv.head_dim % 4 != 0 || a.kv.head_dim > 2 * kLaneDims)
    throw CudaError("decode_attention_block: head_dim " + std::to_string(a.kv.head_dim) +
                    " (a multiple of 4 up to 256: attention_block_groups)");
  const size_t smem = smem_bytes(a.cols, gm_for(a.n_head, a.kv.n_head_kv), a.kv.head_dim, bpg, a.kv.n_head_kv, a.n_head);
  if (!kv_type_ok(a.type, a.kv.dtype, a.kv.head_dim))
    throw CudaError(std::string("decode_attention_block: a KV cache of ") + kv_dtype_name(a.kv.dtype) +
                    " with " + wtype_name(a.type) + " weights and head_dim " + std::to_string(a.kv.head_dim) +
                    " (a 16-bit cache must hold the weights' type, head_dim a multiple of 8)");
  const bool kv16 = a.kv.dtype != KvDtype::F32;
  switch (a.type) {
    case WType::F32: return launch_gm<float, false>(a, smem, stream);
    case WType::F16: return kv16 ? launch_gm<__half, true>(a, smem, stream) : launch_gm<__half, false>(a, smem, stream);
    case WType::BF16:
      return kv16 ? launch_gm<__nv_bfloat16, true>(a, smem, stream) : launch_gm<__nv_bfloat16, false>(a, smem, stream);
  }
}

}  // namespace fdl::cuda
