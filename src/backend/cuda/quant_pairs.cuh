// quant_pairs.cuh — the block-quantized GEMVs' unit of work: a "pair", units 2P and 2P + 1 of
// a row (quant_units.cuh), 64 weights whose halves fall in two 32-value activation groups
// whole, multiplied with a token's 8-bit activations (q8_dot.cuh) as
//   Σ over the pair's groups g:  xd[g] * (d * float(S_g) - dm * float(M_g))   (group_step)
// where S_g is an exact int32 sum of the format's integer scales times dp4a dot products and
// M_g the offsets' integer sum (Q4_K, Q5_K; 0 for the others). Both GEMVs (gemv_quant.cu,
// gemv_quant_staged.cu) add a lane's pairs in pair order with these formulas, so a token's
// result has the same bits in either.
// A pair shares what a lone unit would load or decode twice: Q4_K/Q5_K's 16-byte head and
// its 6-bit scales (the two units of a chunk have the same two), Q6_K's scale d, and the
// activation scales of its two groups; the loads are 16 bytes each, issued by load() before
// dot() uses any. A pair's activations are read once (act(): 64 bytes of 8-bit values, the two
// groups' scales and sums) and multiply every row a lane takes at that pair (dot_act()).
// Device code only; include from .cu files.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/kernels.h"
#include "backend/cuda/q8_dot.cuh"
#include "backend/cuda/quant_units.cuh"

namespace fdl::cuda::quant {

/// Pairs of a row of `cols` values (Q8_0 rows may end in a lone block).
__device__ __forceinline__ int pairs_of(int cols) { return (cols / 32 + 1) / 2; }

/// The token's rounded activations (Q8Activations' layout for one token; shared or global).
/// Every activation row type has q16(at) (16 values from value `at`, a multiple of 16), d(g)
/// (group g's scale), s(i) (the integer sum of half-group i), and d2(g) / s4(g) for groups g,
/// g + 1 (g even; s4 gives s(2g) .. s(2g + 3)).
struct Q8Row {
  const int8_t* q;   ///< [cols]
  const float* dd;   ///< [cols / 32]
  const int32_t* ss; ///< [cols / 16]
  __device__ uint4 q16(int at) const { return *reinterpret_cast<const uint4*>(q + at); }
  __device__ float d(int g) const { return dd[g]; }
  __device__ int s(int i) const { return ss[i]; }
  __device__ float2 d2(int g) const { return make_float2(dd[g], dd[g + 1]); }
  __device__ int4 s4(int g) const { return make_int4(ss[2 * g], ss[2 * g + 1], ss[2 * g + 2], ss[2 * g + 3]); }
};

/// Where byte `o` of the staged 8-bit activations lives in shared memory: the 16-byte chunks of
/// each 128-byte line permuted by the line's index mod 4 (chunk ^ {0, 1, 6, 7}). A warp's
/// 16-byte loads of 32 pairs (lane i at 64 i + 16 m: Q4_K, Q5_K, Q8_0) or of Q6_K's group pattern
/// (at 32 ga: ga = 0, 1, 4, 5, 8, ...) then fall in distinct banks for every 8 lanes; unpermuted,
/// lanes 64 bytes apart hit the same four banks four times over.
__device__ __forceinline__ int swizzle16(int o) {
  const int line = (o >> 7) & 3;
  return o ^ (((line & 1) | ((line & 2) ? 6 : 0)) << 4);
}

/// A token's activations staged in shared memory (gemv_quant_staged.cu): q permuted by
/// swizzle16 over the whole staging buffer `base` (the token's values from byte `off`), its
/// scales and sums unpermuted, 16-byte aligned for d2/s4 when cols is a multiple of 128.
struct SwizzledQ8Row {
  const int8_t* base;
  int off;
  const float* dd;
  const int32_t* ss;
  __device__ uint4 q16(int at) const { return *reinterpret_cast<const uint4*>(base + swizzle16(off + at)); }
  __device__ float d(int g) const { return dd[g]; }
  __device__ int s(int i) const { return ss[i]; }
  __device__ float2 d2(int g) const { return *reinterpret_cast<const float2*>(dd + g); }
  __device__ int4 s4(int g) const { return *reinterpret_cast<const int4*>(ss + 2 * g); }
};

__device__ __forceinline__ uint4 low_nibbles(const uint4& q) {
  constexpr unsigned k = 0x0f0f0f0fu;
  return make_uint4(q.x & k, q.y & k, q.z & k, q.w & k);
}
__device__ __forceinline__ uint4 high_nibbles(const uint4& q) {
  constexpr unsigned k = 0x0f0f0f0fu;
  return make_uint4((q.x >> 4) & k, (q.y >> 4) & k, (q.z >> 4) & k, (q.w >> 4) & k);
}
/// Adds bit `shift` of each byte of qh, moved to bit 4 (Q5_K's fifth bit; mask 1), or bits
/// shift, shift + 1 moved to bits 4-5 (Q6_K's high bits; mask 3).
__device__ __forceinline__ uint4 with_high_bits(const uint4& q, const uint4& qh, unsigned shift, unsigned mask) {
  const unsigned per_byte = mask * 0x01010101u;
  auto f = [&](unsigned a, unsigned h) { return a | (((h >> shift) & per_byte) << 4); };
  return make_uint4(f(q.x, qh.x), f(q.y, qh.y), f(q.z, qh.z), f(q.w, qh.w));
}

/// acc + xd * (d * S - dm * M), every rounding written out (no contraction into FMAs), so
/// the bits do not depend on how the compiler schedules the kernel around it.
__device__ __forceinline__ float group_step(float acc, float xd, float d, int S, float dm, int M) {
  return __fadd_rn(acc, __fmul_rn(xd, __fsub_rn(__fmul_rn(d, float(S)), __fmul_rn(dm, float(M)))));
}

/// Q4_K's 6-bit scale and min of groups 2c, 2c + 1 of a super-block (Q4K::finish's decode).
struct ChunkScales {
  int sc0, sc1, m0, m1;
};
__device__ __forceinline__ ChunkScales chunk_scales(const uint4& head, int c) {
  const unsigned w0 = head.y, w1 = head.z, w2 = head.w;
  const unsigned sc = c < 2 ? (w0 & 0x3f3f3f3fu) : ((w2 & 0x0f0f0f0fu) | ((w0 >> 2) & 0x30303030u));
  const unsigned mn = c < 2 ? (w1 & 0x3f3f3f3fu) : (((w2 >> 4) & 0x0f0f0f0fu) | ((w1 >> 2) & 0x30303030u));
  const unsigned shift = unsigned(16 * (c & 1));
  return ChunkScales{int((sc >> shift) & 0xffu), int((sc >> (shift + 8)) & 0xffu), int((mn >> shift) & 0xffu),
                     int((mn >> (shift + 8)) & 0xffu)};
}

/// A pair's activations: 64 values, the scales of its two groups, and the integer sums the
/// format needs (Q4_K/Q5_K: the two groups' sums; Q6_K: the four half-group sums).
struct PairAct {
  uint4 q[4];
  float d0, d1;
  int s[4];
};

/// Q4_K/Q5_K pairs cover groups 2P (q[0], q[1]) and 2P + 1 (q[2], q[3]).
template <typename Row>
__device__ __forceinline__ PairAct kquant_act(int P, const Row& x) {
  PairAct a;
#pragma unroll
  for (int m = 0; m < 4; ++m) a.q[m] = x.q16(64 * P + 16 * m);
  const float2 d = x.d2(2 * P);
  const int4 s = x.s4(2 * P);
  a.d0 = d.x;
  a.d1 = d.y;
  a.s[0] = s.x + s.y;
  a.s[1] = s.z + s.w;
  return a;
}

/// Q4_K/Q5_K: chunk c = P % 4 of super-block P / 4: groups g0 = 8b + 2c (the nibbles' low
/// halves) and g0 + 1 (high halves), value i of each group in half i / 16 of the chunk.
__device__ __forceinline__ void kquant_chunk_dot(const uint4& head, const uint4 (&lo)[2], const uint4 (&hi)[2], int P,
                                                 const PairAct& x, float& acc) {
  const ChunkScales s = chunk_scales(head, P & 3);
  const float d = half_bits(head.x), dmin = half_bits(head.x >> 16);
  const int i0 = dot16(lo[1], x.q[1]) + dot16(lo[0], x.q[0]);
  const int i1 = dot16(hi[1], x.q[3]) + dot16(hi[0], x.q[2]);
  acc = group_step(acc, x.d0, d, s.sc0 * i0, dmin, s.m0 * x.s[0]);
  acc = group_step(acc, x.d1, d, s.sc1 * i1, dmin, s.m1 * x.s[1]);
}

struct Q4KPair {
  static constexpr QType kType = QType::Q4_K;
  struct Raw {
    uint4 head, q0, q1;
  };
  __device__ static void load(const uint8_t* row, int P, int /*cols*/, Raw& r) {
    const uint8_t* blk = row + size_t(P >> 2) * 144;
    r.head = __ldg(reinterpret_cast<const uint4*>(blk));
    r.q0 = ld16(blk + 16 + 32 * (P & 3));
    r.q1 = ld16(blk + 32 + 32 * (P & 3));
  }
  template <typename Row>
  __device__ static PairAct act(int P, int /*cols*/, const Row& x) {
    return kquant_act(P, x);
  }
  __device__ static void dot_act(const Raw& r, int P, int /*cols*/, const PairAct& x, float& acc) {
    const uint4 lo[2] = {low_nibbles(r.q0), low_nibbles(r.q1)}, hi[2] = {high_nibbles(r.q0), high_nibbles(r.q1)};
    kquant_chunk_dot(r.head, lo, hi, P, x, acc);
  }
  template <typename Row>
  __device__ static void dot(const Raw& r, int P, int cols, const Row& x, float& acc) {
    dot_act(r, P, cols, act(P, cols, x), acc);
  }
};

struct Q5KPair {
  static constexpr QType kType = QType::Q5_K;
  struct Raw {
    uint4 head, qh0, qh1, q0, q1;
  };
  __device__ static void load(const uint8_t* row, int P, int /*cols*/, Raw& r) {
    const uint8_t* blk = row + size_t(P >> 2) * 176;
    r.head = __ldg(reinterpret_cast<const uint4*>(blk));
    r.qh0 = __ldg(reinterpret_cast<const uint4*>(blk + 16));  // shared by the 4 chunks
    r.qh1 = __ldg(reinterpret_cast<const uint4*>(blk + 32));
    r.q0 = ld16(blk + 48 + 32 * (P & 3));
    r.q1 = ld16(blk + 64 + 32 * (P & 3));
  }
  template <typename Row>
  __device__ static PairAct act(int P, int /*cols*/, const Row& x) {
    return kquant_act(P, x);
  }
  __device__ static void dot_act(const Raw& r, int P, int /*cols*/, const PairAct& x, float& acc) {
    const unsigned c = unsigned(P & 3);
    const uint4 lo[2] = {with_high_bits(low_nibbles(r.q0), r.qh0, 2 * c, 1u),
                         with_high_bits(low_nibbles(r.q1), r.qh1, 2 * c, 1u)};
    const uint4 hi[2] = {with_high_bits(high_nibbles(r.q0), r.qh0, 2 * c + 1, 1u),
                         with_high_bits(high_nibbles(r.q1), r.qh1, 2 * c + 1, 1u)};
    kquant_chunk_dot(r.head, lo, hi, P, x, acc);
  }
  template <typename Row>
  __device__ static void dot(const Raw& r, int P, int cols, const Row& x, float& acc) {
    dot_act(r, P, cols, act(P, cols, x), acc);
  }
};

/// Q6_K (planar rows, Q6K's layout): pair P is units 2P, 2P + 1 of super-block b = P / 4, half
/// h = (P / 2) % 2, p = P % 2: ql bytes 64h + 32p .. + 31, qh bytes 32h .. + 31; groups
/// ga = 8b + 4h + p (low nibbles, scales 8h + 2p + k) and ga + 2 (high nibbles, scales
/// 8h + 2(p + 2) + k), k the half of the group.
struct Q6KPair {
  static constexpr QType kType = QType::Q6_K;
  struct Raw {
    uint4 ql0, ql1, qh0, qh1;
    unsigned sa, sb;  // two int8 scales each (k = 0, 1)
    unsigned d;
  };
  __device__ static void load(const uint8_t* row, int P, int cols, Raw& r) {
    const int nb = cols / 256, b = P >> 2, h = (P >> 1) & 1, p = P & 1;
    r.ql0 = ld16(row + size_t(b) * 128 + 64 * h + 32 * p);
    r.ql1 = ld16(row + size_t(b) * 128 + 64 * h + 32 * p + 16);
    r.qh0 = ld16(row + size_t(nb) * 128 + size_t(b) * 64 + 32 * h);
    r.qh1 = ld16(row + size_t(nb) * 128 + size_t(b) * 64 + 32 * h + 16);
    const auto* scales = reinterpret_cast<const unsigned short*>(row + size_t(nb) * 192 + size_t(b) * 16);
    r.sa = __ldg(scales + 4 * h + p);
    r.sb = __ldg(scales + 4 * h + p + 2);
    r.d = __ldg(reinterpret_cast<const unsigned short*>(row + size_t(nb) * 208) + b);
  }
  /// q[0], q[1]: group ga = 8b + 4h + p; q[2], q[3]: group gb = ga + 2; s: their half-group sums.
  template <typename Row>
  __device__ static PairAct act(int P, int /*cols*/, const Row& x) {
    const int ga = (P >> 2) * 8 + 4 * ((P >> 1) & 1) + (P & 1), gb = ga + 2;
    PairAct a;
    a.q[0] = x.q16(32 * ga);
    a.q[1] = x.q16(32 * ga + 16);
    a.q[2] = x.q16(32 * gb);
    a.q[3] = x.q16(32 * gb + 16);
    a.d0 = x.d(ga);
    a.d1 = x.d(gb);
    a.s[0] = x.s(2 * ga);
    a.s[1] = x.s(2 * ga + 1);
    a.s[2] = x.s(2 * gb);
    a.s[3] = x.s(2 * gb + 1);
    return a;
  }
  __device__ static void dot_act(const Raw& r, int P, int /*cols*/, const PairAct& x, float& acc) {
    const int p = P & 1;
    const unsigned lo_shift = unsigned(2 * p), hi_shift = unsigned(2 * p + 4);
    // Group `which` (0: ga, low nibbles; 1: gb, high nibbles).
    auto group = [&](int which, unsigned shift, unsigned scales) {
      int total = 0;
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        const uint4& ql = k == 0 ? r.ql0 : r.ql1;
        const uint4& qh = k == 0 ? r.qh0 : r.qh1;
        const uint4 q = with_high_bits(which ? high_nibbles(ql) : low_nibbles(ql), qh, shift, 3u);
        const int isum = dot16(q, x.q[2 * which + k]);
        const int scale = int(int8_t((scales >> (8 * k)) & 0xffu));
        total += scale * (isum - 32 * x.s[2 * which + k]);
      }
      return total;
    };
    const float d = half_bits(r.d);
    acc = group_step(acc, x.d0, d, group(0, lo_shift, r.sa), 0.f, 0);
    acc = group_step(acc, x.d1, d, group(1, hi_shift, r.sb), 0.f, 0);
  }
  template <typename Row>
  __device__ static void dot(const Raw& r, int P, int cols, const Row& x, float& acc) {
    dot_act(r, P, cols, act(P, cols, x), acc);
  }
};

/// Q8_0 (planar rows): pair P is blocks 2P and 2P + 1 (the second absent at the end of a row of
/// an odd number of blocks).
struct Q80Pair {
  static constexpr QType kType = QType::Q8_0;
  struct Raw {
    uint4 q[4];
    unsigned d;  // both scales (fp16 each)
  };
  __device__ static void load(const uint8_t* row, int P, int cols, Raw& r) {
    const bool two = 2 * P + 1 < cols / 32;
#pragma unroll
    for (int i = 0; i < 4; ++i) r.q[i] = i < 2 || two ? ld16(row + size_t(P) * 64 + 16 * i) : make_uint4(0, 0, 0, 0);
    const auto* d = reinterpret_cast<const unsigned short*>(row + size_t(cols)) + 2 * P;
    r.d = two ? __ldg(reinterpret_cast<const unsigned*>(d)) : unsigned(__ldg(d));  // d is 4-byte aligned: 2P
  }
  /// Blocks 2P (q[0], q[1]) and 2P + 1 (q[2], q[3]; zeros, unread, when absent).
  template <typename Row>
  __device__ static PairAct act(int P, int cols, const Row& x) {
    const int g = 2 * P;
    const bool two = g + 1 < cols / 32;
    PairAct a;
    a.q[0] = x.q16(32 * g);
    a.q[1] = x.q16(32 * g + 16);
    a.q[2] = two ? x.q16(32 * g + 32) : make_uint4(0, 0, 0, 0);
    a.q[3] = two ? x.q16(32 * g + 48) : make_uint4(0, 0, 0, 0);
    a.d0 = x.d(g);
    a.d1 = two ? x.d(g + 1) : 0.f;
    return a;
  }
  __device__ static void dot_act(const Raw& r, int P, int cols, const PairAct& x, float& acc) {
    const int g = 2 * P;
    acc = group_step(acc, x.d0, half_bits(r.d), dot16(r.q[1], x.q[1]) + dot16(r.q[0], x.q[0]), 0.f, 0);
    if (g + 1 < cols / 32)
      acc = group_step(acc, x.d1, half_bits(r.d >> 16), dot16(r.q[3], x.q[3]) + dot16(r.q[2], x.q[2]), 0.f, 0);
  }
  template <typename Row>
  __device__ static void dot(const Raw& r, int P, int cols, const Row& x, float& acc) {
    dot_act(r, P, cols, act(P, cols, x), acc);
  }
};

}  // namespace fdl::cuda::quant
