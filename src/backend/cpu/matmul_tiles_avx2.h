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

/// Rows of a block-quantized type (src/core/quant_blocks.cpp: Q4_0 ... Q6_K): each group of
/// steps is one block of every row, turned into fp32 by the format's dequantizer when the group
/// begins; the steps then read those values. The values are the format's own (the same as
/// dequantize_row's), so the arithmetic is the F32 kernels' on the dequantized row.
template <GgmlType T, int RM>
struct BlockSource {
  static constexpr int kBlock = T == GgmlType::Q4_0 || T == GgmlType::Q4_1 || T == GgmlType::Q5_0 ||
                                        T == GgmlType::Q5_1 || T == GgmlType::Q8_0
                                    ? 32
                                    : 256;
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
