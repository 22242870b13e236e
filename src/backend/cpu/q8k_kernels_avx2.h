// q8k_kernels_avx2.h — internal: the K-quant integer dot products of q8k.h on 256-bit vectors
// (AVX2), and the row driver that feeds them token groups. Included by q8k_avx2.cpp (the
// AVX2 build, groups of up to 8 tokens), q8k_avx512.cpp (the same code compiled with
// AVX-512F/VL, whose 32 vector registers hold groups of up to 16) and q8k_vnni.cpp (with
// AVX-512 VNNI too: vpdpwssd in place of madd + add): the integer sums are exact and the
// float steps the same, so every output has the same bits in all three.
// Per 32 weights and token one maddubs (unsigned levels x signed activations into 16-bit
// pair sums, which cannot saturate at these ranges: 2 x 63 x 127 at most) and one madd by
// the group's integer scale into 32-bit lanes; per 256-weight block one float step per lane,
// in block order, exactly as q8k_dot_reference writes it.
// Include only from a *_avx2.cpp / *_avx512.cpp / *_vnni.cpp file: everything here is TU-local.
#pragma once

#include <cstring>
#include <type_traits>

#include "backend/cpu/q8k.h"
#include "backend/cpu/simd_avx2.h"
#include "flashdllm/dtype.h"

#if FDL_HAVE_AVX2
namespace fdl::cpu::detail {
namespace {

__m256i load32(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// acc + the 32-bit sums of p's 16-bit pairs times s's: one vpdpwssd where the file is compiled
// with AVX-512 VNNI, else madd then add (the same exact integers: no pair sum can overflow).
__m256i add_pair_products(__m256i acc, __m256i p, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpwssd_epi32(acc, p, s);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(p, s));
#endif
}

// The fp16 at p as a float (exact, as half_at), by F16C instead of a call per block.
inline float half_f16c(const unsigned char* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// A block's 8 scales (bytes 0-7 of out) and 8 minimums (bytes 8-15) from GGUF's 12-byte
// K-quant packing (k4_scales' values): word-wide masks and shifts instead of a loop per group.
inline void k4_unpack(const unsigned char* p, uint8_t (&out)[16]) {
  uint32_t u[3];
  std::memcpy(u, p, 12);
  constexpr uint32_t kLow6 = 0x3f3f3f3fu, kLow4 = 0x0f0f0f0fu, kTop2 = 0x03030303u;
  const uint32_t o[4] = {u[0] & kLow6, (u[2] & kLow4) | (((u[0] >> 6) & kTop2) << 4), u[1] & kLow6,
                         ((u[2] >> 4) & kLow4) | (((u[1] >> 6) & kTop2) << 4)};
  std::memcpy(out, o, 16);
}

// The eight lane totals, combined as q8k_dot_reference combines them.
float combined(__m256 v) {
  float l[8];
  _mm256_storeu_ps(l, v);
  return combine_lanes(l);
}

// Q4_K (kQ5 false: 144-byte blocks) and Q5_K (176 bytes: the fifth bits before the nibbles)
// against T tokens of block-major activations (q8k.h): block b of token t at x[b * ld + t].
// Each block's levels and scales are unpacked once for all T, and the T tokens' blocks lie
// at fixed offsets from one pointer.
template <bool kQ5, int T>
void dot_k4(const unsigned char* row, const BlockQ8K* x, int64_t ld, int64_t nb, float (&out)[T]) {
  constexpr int kBytes = kQ5 ? 176 : 144;
  const __m256i m4 = _mm256_set1_epi8(0x0f), one = _mm256_set1_epi8(1);
  __m256 lanes[T];
  for (int t = 0; t < T; ++t) lanes[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const unsigned char* w = row + b * kBytes;
    const unsigned char* qs = w + (kQ5 ? 48 : 16);
    uint8_t sm[16];  // scales, then minimums
    k4_unpack(w + 4, sm);
    [[maybe_unused]] const __m256i qh = kQ5 ? load32(w + 16) : _mm256_setzero_si256();
    __m256i acc[T];
    for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_si256();
    for (int c = 0; c < 4; ++c) {
      const __m256i q4 = load32(qs + 32 * c);
      __m256i lo = _mm256_and_si256(q4, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4);
      if constexpr (kQ5) {  // bit 2c of qh[l] for the low nibbles, bit 2c + 1 for the high ones
        lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), one), 4));
        hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c + 1), one), 4));
      }
      const __m256i s0 = _mm256_set1_epi16(static_cast<int16_t>(sm[2 * c]));
      const __m256i s1 = _mm256_set1_epi16(static_cast<int16_t>(sm[2 * c + 1]));
      for (int t = 0; t < T; ++t) {
        const int8_t* q8 = x[b * ld + t].qs + 64 * c;
        const __m256i p0 = _mm256_maddubs_epi16(lo, load32(q8)), p1 = _mm256_maddubs_epi16(hi, load32(q8 + 32));
        acc[t] = add_pair_products(add_pair_products(acc[t], p0, s0), p1, s1);
      }
    }
    const float d = half_f16c(w), dmin = half_f16c(w + 2);
    // m[g] beside both 16-value sums of group g: one madd gives m[g] * (bsums[2g] + bsums[2g + 1]).
    const __m128i m16 = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sm + 8)));
    const __m256i mv = _mm256_set_m128i(_mm_unpackhi_epi16(m16, m16), _mm_unpacklo_epi16(m16, m16));
    for (int t = 0; t < T; ++t) {
      const BlockQ8K& xb = x[b * ld + t];
      const __m256 msum = _mm256_cvtepi32_ps(_mm256_madd_epi16(load32(xb.bsums), mv));
      const __m256 dd = _mm256_set1_ps(d * xb.d), dm = _mm256_set1_ps(dmin * xb.d);
      lanes[t] = _mm256_add_ps(lanes[t], _mm256_sub_ps(_mm256_mul_ps(dd, _mm256_cvtepi32_ps(acc[t])),
                                                       _mm256_mul_ps(dm, msum)));
    }
  }
  for (int t = 0; t < T; ++t) out[t] = combined(lanes[t]);
}

// Q6_K: 210-byte blocks; levels u = q + 32 in [0, 63], the offset taken out through bsums.
template <int T>
void dot_q6k(const unsigned char* row, const BlockQ8K* x, int64_t ld, int64_t nb, float (&out)[T]) {
  const __m256i m4 = _mm256_set1_epi8(0x0f), m3 = _mm256_set1_epi8(3);
  __m256 lanes[T];
  for (int t = 0; t < T; ++t) lanes[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const unsigned char* w = row + b * 210;
    const auto* scales = reinterpret_cast<const int8_t*>(w + 192);
    __m256i acc[T];
    for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      const __m256i ql0 = load32(w + 64 * h), ql1 = load32(w + 64 * h + 32), qh = load32(w + 128 + 32 * h);
      auto high = [&](int shift) { return _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, shift), m3), 4); };
      const __m256i u[4] = {_mm256_or_si256(_mm256_and_si256(ql0, m4), high(0)),
                            _mm256_or_si256(_mm256_and_si256(ql1, m4), high(2)),
                            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), high(4)),
                            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4), high(6))};
      for (int r = 0; r < 4; ++r) {
        const int g = 8 * h + 2 * r;  // elements 0-15 of the 32 (low 128 bits): group g; 16-31: g + 1
        const __m256i sv = _mm256_set_m128i(_mm_set1_epi16(scales[g + 1]), _mm_set1_epi16(scales[g]));
        for (int t = 0; t < T; ++t) {
          const __m256i p = _mm256_maddubs_epi16(u[r], load32(x[b * ld + t].qs + 128 * h + 32 * r));
          acc[t] = add_pair_products(acc[t], p, sv);
        }
      }
    }
    const float d = half_f16c(w + 208);
    const __m256i sv16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scales)));
    for (int t = 0; t < T; ++t) {
      const BlockQ8K& xb = x[b * ld + t];
      const __m256i offset = _mm256_madd_epi16(load32(xb.bsums), sv16);
      const __m256i v = _mm256_sub_epi32(acc[t], _mm256_slli_epi32(offset, 5));
      lanes[t] = _mm256_add_ps(lanes[t], _mm256_mul_ps(_mm256_set1_ps(d * xb.d), _mm256_cvtepi32_ps(v)));
    }
  }
  for (int t = 0; t < T; ++t) out[t] = combined(lanes[t]);
}

// One weight row against tokens [t0, t0 + T) of the block-major xq (n_tokens per block), into Y.
template <int T>
void row_tokens(GgmlType type, const unsigned char* row, const BlockQ8K* xq, int64_t n_tokens, int64_t nb, int64_t t0,
                float* Y, int64_t y_stride) {
  float out[T];
  if (type == GgmlType::Q4_K) dot_k4<false, T>(row, xq + t0, n_tokens, nb, out);
  else if (type == GgmlType::Q5_K) dot_k4<true, T>(row, xq + t0, n_tokens, nb, out);
  else dot_q6k<T>(row, xq + t0, n_tokens, nb, out);
  for (int t = 0; t < T; ++t) Y[(t0 + t) * y_stride] = out[t];
}

// Y[t * W.rows + r] for t < n_tokens, r in [row_begin, row_end). Tokens in groups of
// kMaxGroup, then 8 and 4, per weight row (each block unpacked once per group), the rest one
// by one: every output's operations are the same in any group, so its bits are too. Rows go
// in tiles of kRowTile, each token group meeting every row of the tile before the next
// group: the group's activations (292 bytes a block and token) stay in L1 across the tile's
// rows instead of every row streaming all the tokens' activations from L2.
template <int kMaxGroup>
void q8k_rows_driver(const WeightMatrix& W, const BlockQ8K* xq, int64_t n_tokens, float* Y, int64_t row_begin,
                     int64_t row_end) {
  constexpr int64_t kRowTile = 16;
  const int64_t nb = W.cols / 256;
  const size_t row_bytes = weight_row_bytes(W.type, W.cols);
  const auto* base = static_cast<const unsigned char*>(W.data);
  for (int64_t r0 = row_begin; r0 < row_end; r0 += kRowTile) {
    const int64_t r1 = r0 + kRowTile < row_end ? r0 + kRowTile : row_end;
    auto tile = [&](auto group, int64_t t) {
      constexpr int T = decltype(group)::value;
      for (int64_t r = r0; r < r1; ++r) row_tokens<T>(W.type, base + r * row_bytes, xq, n_tokens, nb, t, Y + r, W.rows);
    };
    int64_t t = 0;
    if constexpr (kMaxGroup > 8)
      for (; t + kMaxGroup <= n_tokens; t += kMaxGroup) tile(std::integral_constant<int, kMaxGroup>{}, t);
    for (; t + 8 <= n_tokens; t += 8) tile(std::integral_constant<int, 8>{}, t);
    for (; t + 4 <= n_tokens; t += 4) tile(std::integral_constant<int, 4>{}, t);
    for (; t < n_tokens; ++t) tile(std::integral_constant<int, 1>{}, t);
  }
}

}  // namespace
}  // namespace fdl::cpu::detail
#endif
