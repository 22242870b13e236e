// The panel kernels of q8k_panels.h on AVX-512 BW + VNNI. Lane r of every 512-bit vector is
// weight row r of the panel: a step of 8 elements is one 64-byte load of nibbles, unpacked to
// two vectors of levels (elements 8s .. 8s + 3 and 8s + 4 .. 8s + 7 of the 16 rows; Q5_K's and
// Q6_K's high bits added under byte masks loaded straight into mask registers), each
// multiplied with a token's 4 activations by one vpdpbusd against their broadcast. A group's
// int32 sums are scaled by the rows' integer scales (vpmullo) into the block's S; Q4_K/Q5_K's
// minimums take 4 vpdpwssd per block. Tokens go in groups of up to 8 per pass over a panel,
// sharing each unpacked step; every output's operations are the same in any group, so its
// bits are too, and they are q8k_panel_dot_reference's (tests/cpu/q8k_panels_test.cpp).
// Only called when use_avx512_vnni() is true.
#include "backend/cpu/q8k_panels.h"

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#include "backend/cpu/panels_vnni.h"
#endif

#include <cstring>
#include <stdexcept>
#include <type_traits>

namespace fdl::cpu::detail {

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
namespace {

// The byte-shuffle control that zero-extends byte `i` of every 32-bit lane into the lane.
__m512i byte_of_lane(int i) {
  const int z = 0x80;
  return _mm512_set4_epi32(z << 24 | z << 16 | z << 8 | (12 + i), z << 24 | z << 16 | z << 8 | (8 + i),
                           z << 24 | z << 16 | z << 8 | (4 + i), z << 24 | z << 16 | z << 8 | i);
}
// ... bytes i and i + 1 of every lane as two zero-extended 16-bit halves.
__m512i bytes_pair_of_lane(int i) {
  const int z = 0x80;
  auto lane = [&](int base) { return z << 24 | (base + i + 1) << 16 | z << 8 | (base + i); };
  return _mm512_set4_epi32(lane(12), lane(8), lane(4), lane(0));
}

__mmask64 mask_at(const uint8_t* p) {
  uint64_t m;
  std::memcpy(&m, p, 8);
  return _cvtu64_mask64(m);
}

template <GgmlType kType>
struct Format;
template <>
struct Format<GgmlType::Q4_K> {
  static constexpr int kBlock = 144 * 16, kMasks = 0, kScales = 2048, kD = 2048 + 192, kGroup = 32;
};
template <>
struct Format<GgmlType::Q5_K> {
  static constexpr int kBlock = 176 * 16, kMasks = 2, kScales = 2560, kD = 2560 + 192, kGroup = 32;
};
template <>
struct Format<GgmlType::Q6_K> {
  static constexpr int kBlock = 210 * 16, kMasks = 4, kScales = 3072, kD = 3072 + 256, kGroup = 16;
};

// Step s's two vectors of levels: elements 8s .. 8s + 3 (lo) and 8s + 4 .. 8s + 7 (hi).
template <GgmlType kType>
inline void levels(const uint8_t* pb, int s, __m512i& lo, __m512i& hi) {
  using F = Format<kType>;
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  const __m512i w = _mm512_loadu_si512(pb + 64 * s);
  lo = _mm512_and_si512(w, m4);
  hi = _mm512_and_si512(_mm512_srli_epi16(w, 4), m4);
  if constexpr (F::kMasks == 2) {
    const __m512i b4 = _mm512_set1_epi8(16);
    const uint8_t* m = pb + 2048 + 16 * s;
    lo = _mm512_mask_add_epi8(lo, mask_at(m), lo, b4);
    hi = _mm512_mask_add_epi8(hi, mask_at(m + 8), hi, b4);
  } else if constexpr (F::kMasks == 4) {
    const __m512i b4 = _mm512_set1_epi8(16), b5 = _mm512_set1_epi8(32);
    const uint8_t* m = pb + 2048 + 32 * s;
    lo = _mm512_mask_add_epi8(lo, mask_at(m), lo, b4);
    lo = _mm512_mask_add_epi8(lo, mask_at(m + 8), lo, b5);
    hi = _mm512_mask_add_epi8(hi, mask_at(m + 16), hi, b4);
    hi = _mm512_mask_add_epi8(hi, mask_at(m + 24), hi, b5);
  }
}

// Adds the panel's rows times T tokens (block-major activations: block b of token t at
// x[b * ld + t]) to acc[t] (lane r: row r), block by block in q8k_panels.h's arithmetic.
template <GgmlType kType, int T>
void panel_tokens(const uint8_t* panel, int64_t nb, const Q8Panel* x, int64_t ld, __m512 (&acc)[T]) {
  using F = Format<kType>;
  constexpr int kSteps = F::kGroup / 8, kGroups = 256 / F::kGroup;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* pb = panel + b * F::kBlock;
    const Q8Panel* xb = x + b * ld;
    __m512i S[T];
    for (int t = 0; t < T; ++t) S[t] = _mm512_setzero_si512();
    [[maybe_unused]] __m512i sc03, sc47, m03, m47;
    if constexpr (kType != GgmlType::Q6_K) {  // the 6-bit scales and minimums of every row (q8k.h: k4_scales)
      const __m512i u0 = _mm512_loadu_si512(pb + F::kScales), u1 = _mm512_loadu_si512(pb + F::kScales + 64),
                    u2 = _mm512_loadu_si512(pb + F::kScales + 128);
      const __m512i low6 = _mm512_set1_epi32(0x3f3f3f3f), low4 = _mm512_set1_epi32(0x0f0f0f0f),
                    top2 = _mm512_set1_epi32(0x30303030);
      sc03 = _mm512_and_si512(u0, low6);
      m03 = _mm512_and_si512(u1, low6);
      sc47 = _mm512_or_si512(_mm512_and_si512(u2, low4), _mm512_and_si512(_mm512_srli_epi32(u0, 2), top2));
      m47 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u2, 4), low4), _mm512_and_si512(_mm512_srli_epi32(u1, 2), top2));
    }
    for (int g = 0; g < kGroups; ++g) {
      // The group's levels stay in registers while each token takes its products in turn: one
      // sum register per token at a time, and T independent chains for the core to overlap.
      __m512i lv[2 * kSteps];
      for (int i = 0; i < kSteps; ++i) levels<kType>(pb, g * kSteps + i, lv[2 * i], lv[2 * i + 1]);
      __m512i sc;
      if constexpr (kType == GgmlType::Q6_K)
        sc = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(pb + F::kScales + 16 * g)));
      else
        sc = _mm512_shuffle_epi8(g < 4 ? sc03 : sc47, byte_of_lane(g % 4));
      for (int t = 0; t < T; ++t) {
        const int8_t* q = xb[t].qs + F::kGroup * g;
        // Two chains (the low and high halves of each step) where few tokens leave the core
        // little else to overlap.
        __m512i a = _mm512_setzero_si512(), b = _mm512_setzero_si512();
        for (int i = 0; i < kSteps; ++i) {
          a = _mm512_dpbusd_epi32(a, lv[2 * i], bcast32(q + 8 * i));
          if constexpr (T <= 2)
            b = _mm512_dpbusd_epi32(b, lv[2 * i + 1], bcast32(q + 8 * i + 4));
          else
            a = _mm512_dpbusd_epi32(a, lv[2 * i + 1], bcast32(q + 8 * i + 4));
        }
        __m512i sub = T <= 2 ? _mm512_add_epi32(a, b) : a;
        if constexpr (kType == GgmlType::Q6_K) sub = _mm512_sub_epi32(sub, _mm512_set1_epi32(xb[t].offsets[g]));
        S[t] = _mm512_add_epi32(S[t], _mm512_mullo_epi32(sub, sc));
      }
    }
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(pb + F::kD)));
    if constexpr (kType == GgmlType::Q6_K) {
      for (int t = 0; t < T; ++t)
        acc[t] = _mm512_add_ps(acc[t], _mm512_mul_ps(_mm512_mul_ps(d, _mm512_set1_ps(xb[t].d)), _mm512_cvtepi32_ps(S[t])));
    } else {
      const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(pb + F::kD + 32)));
      const __m512i mp[4] = {_mm512_shuffle_epi8(m03, bytes_pair_of_lane(0)), _mm512_shuffle_epi8(m03, bytes_pair_of_lane(2)),
                             _mm512_shuffle_epi8(m47, bytes_pair_of_lane(0)), _mm512_shuffle_epi8(m47, bytes_pair_of_lane(2))};
      for (int t = 0; t < T; ++t) {
        __m512i M = _mm512_setzero_si512();
        for (int j = 0; j < 4; ++j) M = _mm512_dpwssd_epi32(M, mp[j], _mm512_set1_epi32(xb[t].min_pairs[j]));
        const __m512 xd = _mm512_set1_ps(xb[t].d);
        const __m512 a = _mm512_mul_ps(_mm512_mul_ps(d, xd), _mm512_cvtepi32_ps(S[t]));
        const __m512 m = _mm512_mul_ps(_mm512_mul_ps(dmin, xd), _mm512_cvtepi32_ps(M));
        acc[t] = _mm512_add_ps(acc[t], _mm512_sub_ps(a, m));
      }
    }
  }
}

}  // namespace

void q8k_panels_vnni(const WeightMatrix& W, const Q8Panel* xp, int64_t n_tokens, float* Y, int64_t row_begin,
                     int64_t row_end) {
  const int64_t nb = W.cols / 256;
  auto run = [&](auto type) {
    constexpr GgmlType kType = decltype(type)::value;
    panels_by_token_groups("q8k_panels_vnni", W, size_t(Format<kType>::kBlock) * size_t(nb), n_tokens, Y, row_begin,
                           row_end, [&](auto size, const uint8_t* panel, int64_t t0, auto& acc) {
                             panel_tokens<kType, decltype(size)::value>(panel, nb, xp + t0, n_tokens, acc);
                           });
  };
  switch (W.type) {
    case GgmlType::Q4_K: return run(std::integral_constant<GgmlType, GgmlType::Q4_K>{});
    case GgmlType::Q5_K: return run(std::integral_constant<GgmlType, GgmlType::Q5_K>{});
    case GgmlType::Q6_K: return run(std::integral_constant<GgmlType, GgmlType::Q6_K>{});
    default: throw std::invalid_argument("q8k_panels_vnni: not a K-quant matrix");
  }
}
#else  // a compiler or target without AVX-512 VNNI: never dispatched to
void q8k_panels_vnni(const WeightMatrix&, const Q8Panel*, int64_t, float*, int64_t, int64_t) {
  throw std::logic_error("q8k_panels_vnni: this build has no AVX-512 VNNI kernels");
}
#endif

}  // namespace fdl::cpu::detail
