// matmul_tiles_avx2.h — internal: the register-tiled inner-product kernel behind
// matmul_driver_avx2.h. Include only from *_avx2.cpp / *_avx512.cpp files.
//
// A tile computes RM weight rows x RN tokens. Every output owns one 8-lane accumulator;
// each k-step of 8 loads RN activation vectors and RM weight vectors and issues RM*RN FMAs,
// so every output sees exactly the canonical sequence of matmul.h (lane l accumulates
// k ≡ l mod 8 in increasing k, last step zero-padded, fixed lane tree) whatever the tile
// shape. That is what makes the GEMV (RN = 1..3, weights widened on the fly) and the GEMM
// (RN = 3, weights pre-widened into a panel) bit-identical.
//
// Weight sources provide the widened weights of one step:
//   static constexpr int kGroupSteps;        steps sharing per-group setup (Q8_0: 4 per block)
//   void begin_group(int64_t group);         called before the steps of each group
//   void prefetch(int64_t step);             hint the memory system ahead of `step`
//   __m256 load(int i, int64_t step);        row i of the tile, weights [8*step, 8*step+8)
//   __m256 load_tail(int i);                 the zero-padded last partial step (if any)
#pragma once

#include "backend/cpu/simd_avx2.h"
#include "backend/cpu/kernels.h"
#include "flashdllm/dtype.h"

#if FDL_HAVE_AVX2
#include <array>
#include <cstdint>
#include <cstring>

namespace fdl::cpu::tiles {
inline namespace FDL_ISA_NS {  // see simd_avx2.h

/// How far ahead of the weights being read the in-place sources prefetch, in bytes. The RM
/// rows of a tile are adjacent in memory, so the tile is one contiguous range read as RM
/// interleaved streams; the hardware prefetchers follow those short streams poorly (GEMV
/// reached ~45% of streaming bandwidth without help), so the sources also walk one linear
/// prefetch pointer through the matrix at the rate the weights are consumed. 16 KiB into
/// L2 measured best on the 2-core EPYC (Zen 4) dev machine: ~85% of streaming bandwidth.
constexpr int64_t kPrefetchBytes = 16 * 1024;

/// Prefetches kBytes bytes starting at p into L2, one hint per cache line. Volatile asm, not
/// _mm_prefetch: GCC 12 dropped the builtin from some tile instantiations (the F16 4x2 tile
/// lost it and ran 2.3x slower from memory), and the hint is what keeps these streams fast.
template <int kBytes>
inline void prefetch_span(const unsigned char* p) {
  for (int off = 0; off < kBytes; off += 64) asm volatile("prefetcht1 (%0)" : : "r"(p + off));
}

/// Rows of the GEMM's packed weight panel.
constexpr int kPanelRows = 4;

/// One 8-lane step of a packed panel; a struct (not __m256) so it can live in a std::vector.
struct alignas(32) Lane8 {
  float v[8];
};

/// Reduces four accumulators with the canonical lane tree and returns
/// [r(a), r(b), r(c), r(d)], bit-identical to simd::hsum_canonical of each.
inline __m128 reduce4_canonical(__m256 a, __m256 b, __m256 c, __m256 d) { return simd::hsum4_canonical(a, b, c, d); }

/// Runs steps [s_begin, s_end) of one RM x RN tile, then the zero-padded partial step of
/// `tail` (1..7) elements if `tail` > 0 (pass 0 unless this range ends the row).
/// Accumulators start from `acc_in` (nullptr: zero) — laid out [i*RN + j] — and end in
/// `acc_out`, or, if that is nullptr, are reduced and stored to Y[j*y_stride + i].
/// Saving and reloading accumulators between k-chunks is exact, so a chunked run performs
/// the same arithmetic as an unchunked one. x: RN activation rows at stride x_stride.
template <int RM, int RN, class Source>
inline void run_tile(Source& src, const float* x, int64_t x_stride, int64_t s_begin, int64_t s_end, int tail,
                     const Lane8* acc_in, Lane8* acc_out, float* y, int64_t y_stride) {
  __m256 acc[RM][RN];
  for (int i = 0; i < RM; ++i)
    for (int j = 0; j < RN; ++j)
      acc[i][j] = acc_in ? _mm256_load_ps(acc_in[i * RN + j].v) : _mm256_setzero_ps();

  auto step = [&](int64_t s) __attribute__((always_inline)) {
    src.prefetch(s);
    __m256 xv[RN];
    for (int j = 0; j < RN; ++j) xv[j] = _mm256_loadu_ps(x + j * x_stride + s * 8);
    for (int i = 0; i < RM; ++i) {
      const __m256 wv = src.load(i, s);
      for (int j = 0; j < RN; ++j) acc[i][j] = _mm256_fmadd_ps(wv, xv[j], acc[i][j]);
    }
  };
  // Sources with multi-step groups (Q8_0 blocks) are only given group-aligned ranges.
  constexpr int G = Source::kGroupSteps;
  for (int64_t g = s_begin / G; g < s_end / G; ++g) {
    src.begin_group(g);
#pragma GCC unroll 4
    for (int u = 0; u < G; ++u) step(g * G + u);
  }
  if (tail > 0) {
    const __m256i m = simd::tail_mask(tail);
    __m256 xv[RN];
    for (int j = 0; j < RN; ++j) xv[j] = _mm256_maskload_ps(x + j * x_stride + s_end * 8, m);
    for (int i = 0; i < RM; ++i) {
      const __m256 wv = src.load_tail(i);
      for (int j = 0; j < RN; ++j) acc[i][j] = _mm256_fmadd_ps(wv, xv[j], acc[i][j]);
    }
  }

  if (acc_out) {
    for (int i = 0; i < RM; ++i)
      for (int j = 0; j < RN; ++j) _mm256_store_ps(acc_out[i * RN + j].v, acc[i][j]);
    return;
  }
  for (int j = 0; j < RN; ++j) {
    int i = 0;
    for (; i + 4 <= RM; i += 4)
      _mm_storeu_ps(y + j * y_stride + i, reduce4_canonical(acc[i][j], acc[i + 1][j], acc[i + 2][j], acc[i + 3][j]));
    for (; i < RM; ++i) y[j * y_stride + i] = simd::hsum_canonical(acc[i][j]);
  }
}

/// Weights already widened into a panel laid out [step][row][8] (32-byte aligned) holding
/// steps [first_step, ...) of the rows; the zero-padded tail step, if any, follows the last
/// full step.
template <int RM>
struct PanelSource {
  static constexpr int kGroupSteps = 1;
  const float* panel;
  int64_t first_step;
  int64_t full_steps;  // of the whole row, to locate the tail step
  void begin_group(int64_t) {}
  void prefetch(int64_t) const {}  // the panel is in L1
  __m256 load(int i, int64_t s) const { return _mm256_load_ps(panel + ((s - first_step) * RM + i) * 8); }
  __m256 load_tail(int i) const { return load(i, full_steps); }
};

/// How one element type widens 8 elements to fp32 (exactly).
struct WidenF32 {
  using Elem = float;
  static __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
};
struct WidenF16 {
  using Elem = uint16_t;
  static __m256 load8(const uint16_t* p) { return simd::load8_f16(p); }
};
struct WidenBF16 {
  using Elem = uint16_t;
  static __m256 load8(const uint16_t* p) { return simd::load8_bf16(p); }
};

/// F32 / F16 / BF16 rows read in place and widened step by step.
template <class Widen, int RM>
struct RowSource {
  using Elem = typename Widen::Elem;
  static constexpr int kGroupSteps = 1;
  // Rows per single-token tile. 8 (8 FMA chains) is ~17% faster when the matrix is hot in
  // L2, but decode streams the weights from L3/DRAM, where 4 rows measured faster: codelm-16m
  // (F16) plain decode 1321 vs 1172 tok/s, bench_matmul cold shapes 3-20%.
  static constexpr int kGemvRows = 4;
  static constexpr int kStepBytes = RM * 8 * static_cast<int>(sizeof(Elem));  // consumed per step
  const Elem* rows[RM];
  const unsigned char* prefetch_base;
  alignas(32) float tails[RM][8];  // zero-padded last partial step of each row
  RowSource(const unsigned char* first_row, size_t row_bytes, int64_t full_steps, int tail)
      : prefetch_base(first_row + kPrefetchBytes) {
    for (int i = 0; i < RM; ++i) {
      rows[i] = reinterpret_cast<const Elem*>(first_row + static_cast<size_t>(i) * row_bytes);
      Elem buf[8] = {};
      if (tail > 0) std::memcpy(buf, rows[i] + full_steps * 8, static_cast<size_t>(tail) * sizeof(Elem));
      _mm256_store_ps(tails[i], Widen::load8(buf));
    }
  }
  void begin_group(int64_t) {}
  void prefetch(int64_t s) const { prefetch_span<kStepBytes>(prefetch_base + s * kStepBytes); }
  __m256 load(int i, int64_t s) const { return Widen::load8(rows[i] + s * 8); }
  __m256 load_tail(int i) const { return _mm256_load_ps(tails[i]); }
};

template <int RM>
using F32Source = RowSource<WidenF32, RM>;
template <int RM>
using F16Source = RowSource<WidenF16, RM>;
template <int RM>
using BF16Source = RowSource<WidenBF16, RM>;

/// Q8_0 rows read in place: each group of 4 steps is one 32-element block whose fp16 scale
/// is broadcast once per row. Q8_0 widths are multiples of 32, so there is never a tail.
template <int RM>
struct Q8Source {
  static constexpr int kGroupSteps = 4;
  static constexpr int kGemvRows = 4;  // 8 rows measured no faster (the widening dominates)
  static constexpr int kGroupBytes = RM * static_cast<int>(sizeof(BlockQ8_0));  // consumed per group
  const BlockQ8_0* rows[RM];
  const BlockQ8_0* block[RM];
  const unsigned char* prefetch_base;
  __m256 scale[RM];
  Q8Source(const unsigned char* first_row, size_t row_bytes, int64_t, int)
      : prefetch_base(first_row + kPrefetchBytes) {
    for (int i = 0; i < RM; ++i)
      rows[i] = reinterpret_cast<const BlockQ8_0*>(first_row + static_cast<size_t>(i) * row_bytes);
  }
  void prefetch(int64_t) const {}  // once per block, in begin_group
  void begin_group(int64_t g) {
    prefetch_span<kGroupBytes>(prefetch_base + g * kGroupBytes);
    for (int i = 0; i < RM; ++i) {
      block[i] = rows[i] + g;
      scale[i] = _mm256_set1_ps(_cvtsh_ss(block[i]->d));
    }
  }
  __m256 load(int i, int64_t s) const { return simd::load8_q8(block[i]->qs + (s & 3) * 8, scale[i]); }
  __m256 load_tail(int) const { return _mm256_setzero_ps(); }
};

/// What the register-widening block sources share: the RM rows, one linear prefetch stream
/// ahead of them (a group's blocks are requested when it begins), no partial step.
template <int RM, int kBlockBytes>
struct BlockRows {
  const unsigned char* rows[RM];
  const unsigned char* prefetch_base;
  BlockRows(const unsigned char* first_row, size_t row_bytes) : prefetch_base(first_row + kPrefetchBytes) {
    for (int i = 0; i < RM; ++i) rows[i] = first_row + static_cast<size_t>(i) * row_bytes;
  }
  void prefetch_group(int64_t g) const { prefetch_span<RM * kBlockBytes>(prefetch_base + g * RM * kBlockBytes); }
  const unsigned char* block(int i, int64_t g) const { return rows[i] + static_cast<size_t>(g) * kBlockBytes; }
  void prefetch(int64_t) const {}  // once per block, in begin_group
  __m256 load_tail(int) const { return _mm256_setzero_ps(); }
};

/// The fp16 value at p (any alignment) as fp32 (exact).
inline float half_at(const unsigned char* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

/// Eight unsigned bytes as eight int32 lanes.
inline __m256i widen_u8(__m128i b) { return _mm256_cvtepu8_epi32(b); }

/// Q4_K rows widened in registers step by step (no block buffer): step t of a block (8
/// elements) is chunk c = t / 8's low (t % 8 < 4) or high nibbles of its bytes 8 (t % 4) ..,
/// scaled by that 32-element group's d * scale and dmin * min, exactly as the format computes
/// them (core/quant_block_formats.h: (d * scale) * q - dmin * min, no FMA).
template <int RM>
struct Q4KSource : BlockRows<RM, 144> {
  static constexpr int kGroupSteps = 32;
  static constexpr int kGemvRows = 4;
  const unsigned char* qs[RM];
  float dsc[RM][8], dmn[RM][8];  // per 32-element group: d * scale, dmin * min
  Q4KSource(const unsigned char* first_row, size_t row_bytes, int64_t, int) : BlockRows<RM, 144>(first_row, row_bytes) {}
  void begin_group(int64_t g) {
    this->prefetch_group(g);
    for (int i = 0; i < RM; ++i) {
      const unsigned char* b = this->block(i, g);
      const float d = half_at(b);
      const float dmin = half_at(b + 2);
      const unsigned char* p = b + 4;
      for (int j = 0; j < 8; ++j) {
        const int sc = j < 4 ? p[j] & 63 : (p[j + 4] & 0x0f) | ((p[j - 4] >> 6) << 4);
        const int m = j < 4 ? p[j + 4] & 63 : (p[j + 4] >> 4) | ((p[j] >> 6) << 4);
        dsc[i][j] = d * static_cast<float>(sc);
        dmn[i][j] = dmin * static_cast<float>(m);
      }
      qs[i] = b + 16;
    }
  }
  __m256 load(int i, int64_t s) const {
    const int t = static_cast<int>(s & 31), c = t >> 3, hi = (t >> 2) & 1, grp = 2 * c + hi;
    __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs[i] + 32 * c + 8 * (t & 3)));
    if (hi) b = _mm_srli_epi16(b, 4);
    b = _mm_and_si128(b, _mm_set1_epi8(0x0f));
    const __m256 q = _mm256_cvtepi32_ps(widen_u8(b));
    return _mm256_sub_ps(_mm256_mul_ps(_mm256_set1_ps(dsc[i][grp]), q), _mm256_set1_ps(dmn[i][grp]));
  }
};

/// Byte j of kFifthBits[v] is bit j of v as a fifth bit (16 or 0): eight Q5 high bits in one load.
inline constexpr auto kFifthBits = [] {
  std::array<uint64_t, 256> t{};
  for (int v = 0; v < 256; ++v)
    for (int j = 0; j < 8; ++j) t[v] |= static_cast<uint64_t>(((v >> j) & 1) << 4) << (8 * j);
  return t;
}();

/// Q4_0, Q4_1, Q5_0 and Q5_1 rows (32-element blocks) widened in registers: step t of a block
/// is the low (t < 2) or high nibbles of bytes 8 (t % 2) .. and, for Q5, bits 8t .. 8t + 7 of
/// qh as fifth bits; then (q - offset) * d, or q * d + m for the types with a minimum
/// (core/quant_block_formats.h, in the same order).
template <GgmlType T>
struct Block32Layout {
  static constexpr bool kFive = T == GgmlType::Q5_0 || T == GgmlType::Q5_1;
  static constexpr bool kMin = T == GgmlType::Q4_1 || T == GgmlType::Q5_1;
  static constexpr int kHighOffset = kMin ? 4 : 2;  // qh after d (and m)
  static constexpr int kQsOffset = kHighOffset + (kFive ? 4 : 0);
  static constexpr int kBlockBytes = kQsOffset + 16;
  static constexpr int kZero = kMin ? 0 : kFive ? 16 : 8;  // subtracted from q (no minimum)
};
template <GgmlType T, int RM>
struct Block32Source : Block32Layout<T>, BlockRows<RM, Block32Layout<T>::kBlockBytes> {
  using L = Block32Layout<T>;
  static constexpr int kGroupSteps = 4;
  static constexpr int kGemvRows = 4;
  const unsigned char* qs[RM];
  __m256 d[RM], m[RM];
  uint32_t qh[RM];
  Block32Source(const unsigned char* first_row, size_t row_bytes, int64_t, int)
      : BlockRows<RM, L::kBlockBytes>(first_row, row_bytes) {}
  void begin_group(int64_t g) {
    this->prefetch_group(g);
    for (int i = 0; i < RM; ++i) {
      const unsigned char* b = this->block(i, g);
      d[i] = _mm256_set1_ps(half_at(b));
      if constexpr (L::kMin) m[i] = _mm256_set1_ps(half_at(b + 2));
      if constexpr (L::kFive) std::memcpy(&qh[i], b + L::kHighOffset, 4);
      qs[i] = b + L::kQsOffset;
    }
  }
  __m256 load(int i, int64_t s) const {
    const int t = static_cast<int>(s & 3);
    __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs[i] + 8 * (t & 1)));
    if (t >= 2) b = _mm_srli_epi16(b, 4);
    b = _mm_and_si128(b, _mm_set1_epi8(0x0f));
    if constexpr (L::kFive)
      b = _mm_or_si128(b, _mm_cvtsi64_si128(static_cast<long long>(kFifthBits[(qh[i] >> (8 * t)) & 0xffu])));
    const __m256i q = widen_u8(b);
    if constexpr (L::kMin) return _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(q), d[i]), m[i]);
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(q, _mm256_set1_epi32(L::kZero))), d[i]);
  }
};

/// Q6_K rows widened in registers: step t of a block is half h = t / 16, quarter r = (t / 4) %
/// 4, elements 8 (t % 4) .. of that quarter: the low (r < 2) or high nibbles of ql and bits 2r,
/// 2r + 1 of qh, minus 32, times d * scale (core/quant_block_formats.h).
template <int RM>
struct Q6KSource : BlockRows<RM, 210> {
  static constexpr int kGroupSteps = 32;
  static constexpr int kGemvRows = 4;
  const unsigned char* cur[RM];
  float dsc[RM][16];  // per 16-element group: d * scale
  Q6KSource(const unsigned char* first_row, size_t row_bytes, int64_t, int) : BlockRows<RM, 210>(first_row, row_bytes) {}
  void begin_group(int64_t g) {
    this->prefetch_group(g);
    for (int i = 0; i < RM; ++i) {
      const unsigned char* b = this->block(i, g);
      const float d = half_at(b + 208);
      const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
      for (int j = 0; j < 16; ++j) dsc[i][j] = d * static_cast<float>(sc[j]);
      cur[i] = b;
    }
  }
  __m256 load(int i, int64_t s) const {
    const int t = static_cast<int>(s & 31), h = t >> 4, r = (t >> 2) & 3, l0 = 8 * (t & 3);
    const unsigned char* b = cur[i];
    __m128i lo = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 64 * h + 32 * (r & 1) + l0));
    if (r >= 2) lo = _mm_srli_epi16(lo, 4);
    lo = _mm_and_si128(lo, _mm_set1_epi8(0x0f));
    __m128i hb = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 128 + 32 * h + l0));
    hb = _mm_and_si128(_mm_srl_epi16(hb, _mm_cvtsi32_si128(2 * r)), _mm_set1_epi8(0x03));
    const __m128i q8 = _mm_or_si128(lo, _mm_slli_epi16(hb, 4));
    const __m256i q = _mm256_sub_epi32(widen_u8(q8), _mm256_set1_epi32(32));
    return _mm256_mul_ps(_mm256_set1_ps(dsc[i][8 * h + 2 * r + (l0 >> 4)]), _mm256_cvtepi32_ps(q));
  }
};

/// Rows of the 256-element block types without a register source (Q2_K, Q3_K, Q5_K;
/// core/quant_block_formats.h): each group of steps is one block of every row, turned into
/// fp32 by the format's dequantizer when the group begins; the steps then read those values.
/// The values are the format's own (the same as dequantize_row's), so the arithmetic is the
/// F32 kernels' on the dequantized row.
template <GgmlType T, int RM>
struct BlockSource {
  static constexpr int kBlock = 256;
  static constexpr int kGroupSteps = kBlock / 8;
  static constexpr int kGemvRows = 4;
  const unsigned char* rows[RM];
  size_t block_bytes;
  DequantizeBlockFn dequantize;
  alignas(32) float values[RM][kBlock];
  BlockSource(const unsigned char* first_row, size_t row_bytes, int64_t full_steps, int)
      : block_bytes(row_bytes / static_cast<size_t>(full_steps / kGroupSteps)), dequantize(detail::block_dequantizer_avx2(T)) {
    for (int i = 0; i < RM; ++i) rows[i] = first_row + static_cast<size_t>(i) * row_bytes;
  }
  void prefetch(int64_t) const {}  // once per block, in begin_group
  void begin_group(int64_t g) {
    for (int i = 0; i < RM; ++i) {
      const unsigned char* b = rows[i] + static_cast<size_t>(g) * block_bytes;
      prefetch_span<64>(b + kPrefetchBytes / 4);
      dequantize(b, values[i]);
    }
  }
  __m256 load(int i, int64_t s) const { return _mm256_load_ps(values[i] + (s % kGroupSteps) * 8); }
  __m256 load_tail(int) const { return _mm256_setzero_ps(); }
};

}  // namespace FDL_ISA_NS
}  // namespace fdl::cpu::tiles
#endif
