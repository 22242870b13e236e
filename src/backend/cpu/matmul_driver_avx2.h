// matmul_driver_avx2.h — internal: the matmul driver behind matmul_avx2.cpp and
// matmul_avx512.cpp. Picks the tile kernels of matmul_tiles_avx2.h per weight type and
// batch size, and blocks the multi-token case for the caches.
//
//  - Up to kDirectMaxTokens tokens (decode, speculative verification): weights are widened
//    in registers as they stream from memory (4 rows at a time), with a linear software
//    prefetch ahead of them, for groups of up to kMaxGroup tokens that reuse the rows from
//    L1. kMaxGroup is the driver's template parameter: 3 with AVX2's 16 vector registers
//    (4x3 accumulators), 6 with AVX-512VL's 32 (4x6: each widened weight vector feeds 6 FMAs
//    instead of 3, and a 4-6 token verification streams the weights once).
//  - More tokens (prefill): 4 weight rows are widened, one k-chunk of at most 768 at a time,
//    into an fp32 panel that stays in L1 while 4x3 tiles sweep a block of tokens that stays
//    in L2; the kernel is FMA-bound.
// Every path runs the same per-output arithmetic (see matmul_tiles_avx2.h), so results do not
// depend on which one ran, nor on kMaxGroup: the AVX-512VL build only has more registers.
//
// Include only from a *_avx2.cpp / *_avx512.cpp file: everything here is TU-local (an
// anonymous namespace), so each TU gets its own copy compiled for its own ISA.
#pragma once

#include <algorithm>
#include <type_traits>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/cpu/matmul_tiles_avx2.h"

#if FDL_HAVE_AVX2
namespace fdl::cpu::detail {
namespace {


using tiles::kPanelRows;

// Batches up to this size use the in-register (direct) kernel, in groups of <= kMaxGroup
// tokens that reuse the rows from L1; larger ones pack panels. Measured on 2048x768 at 2 threads: direct
// is 1.56x (4 tokens) and 1.37x (16 tokens) faster than the panels for F16; for Q8_0, whose
// int8 widening is dearer, 1.25x at 4 tokens but 0.70x at 16.
constexpr int64_t kDirectMaxTokens = 16;
constexpr int64_t kDirectMaxTokensQ8 = 4;
// Tokens per tile in the panel kernel (4 rows x 3 tokens = 12 accumulators + 4 operands).
constexpr int kTileTokens = 3;
// Most steps of 8 per k-chunk of the panel kernel: 4 rows x 768 fp32 = 12 KiB of panel plus
// 3 x 3 KiB of activations stay in L1 (32 KiB) for the whole chunk. Wider rows are cut into
// equal chunks (whole groups of the source: 4 steps for Q8_0 blocks, 32 for 256-element ones);
// chunking a row that fits costs ~7%.
constexpr int64_t kMaxChunkSteps = 96;
static_assert(kMaxChunkSteps % 32 == 0, "a chunk rounded up to whole 32-step groups must fit the panel");
// Bytes of activations per token block of the panel kernel: half of a 1 MiB L2, so the block
// stays there while panels stream past; large enough to amortize re-widening each panel per
// block (512 KiB measured ~4% faster than 256 KiB on 768x2048 at 128 tokens).
constexpr int64_t kTokenBlockBytes = 512 * 1024;

struct Shape {
  const unsigned char* base;
  size_t row_bytes;
  int64_t rows, cols, full_steps;
  int tail;
};

// Calls f.template operator()<RM>() for rm in 1..4 (rm is known only at run time).
template <class F>
inline void with_rows(int64_t rm, F&& f) {
  switch (rm) {
    case 4: f.template operator()<4>(); break;
    case 3: f.template operator()<3>(); break;
    case 2: f.template operator()<2>(); break;
    default: f.template operator()<1>(); break;
  }
}

template <template <int> class Source, int RM, int RN>
void direct_tile(const Shape& sh, const float* X, float* Y, int64_t r) {
  Source<RM> src(sh.base + static_cast<size_t>(r) * sh.row_bytes, sh.row_bytes, sh.full_steps, sh.tail);
  tiles::run_tile<RM, RN>(src, X, sh.cols, 0, sh.full_steps, sh.tail, nullptr, nullptr, Y + r, sh.rows);
}

// Tokens per group when n tokens are split into the fewest groups of at most kMaxGroup, as
// equal as possible (a 1-token group has only RM FMA chains and runs latency-bound, so 4
// tokens under kMaxGroup 3 are 2 + 2, not 3 + 1).
template <int kMaxGroup>
inline int64_t next_group(int64_t left) {
  const int64_t groups = (left + kMaxGroup - 1) / kMaxGroup;
  return (left + groups - 1) / groups;
}

template <template <int> class Source, int RM, int RN, int kMaxGroup>
inline void direct_group(int64_t rn, const Shape& sh, const float* x, float* y, int64_t r) {
  if constexpr (RN > 1)
    if (rn < RN) return direct_group<Source, RM, RN - 1, kMaxGroup>(rn, sh, x, y, r);
  direct_tile<Source, RM, RN>(sh, x, y, r);
}

template <template <int> class Source, int kMaxGroup>
void direct_rows(const Shape& sh, const float* X, int64_t n_tokens, float* Y, int64_t r0, int64_t r1) {
  int64_t r = r0;
  // A single token has one FMA chain per row: wider tiles keep more chains in flight where
  // the source says so (kGemvRows).
  constexpr int kGemvRows = Source<1>::kGemvRows;
  if (n_tokens == 1 && kGemvRows > kPanelRows)
    for (; r + kGemvRows <= r1; r += kGemvRows) direct_tile<Source, kGemvRows, 1>(sh, X, Y, r);
  for (; r < r1; r += kPanelRows) {
    with_rows(std::min<int64_t>(kPanelRows, r1 - r), [&]<int RM>() {
      // Token groups share the RM rows: the first group streams them from memory, later
      // groups find them in L1 (RM rows x cols x 2 bytes for F16 is ~6 KiB at 768).
      for (int64_t t = 0; t < n_tokens;) {
        const int64_t rn = next_group<kMaxGroup>(n_tokens - t);
        direct_group<Source, RM, kMaxGroup, kMaxGroup>(rn, sh, X + t * sh.cols, Y + t * sh.rows, r);
        t += rn;
      }
    });
  }
}

// Widens steps [s0, s1) of RM rows into panel[step - s0][row] (8 floats each), then the
// zero-padded tail step if `tail` > 0. s0 is a multiple of the source's group size, and so is
// s1 unless it is the row's last full step.
template <int RM, class Source>
void pack_panel(Source& src, int64_t s0, int64_t s1, int tail, tiles::Lane8* panel) {
  constexpr int G = Source::kGroupSteps;
  for (int64_t g = s0 / G; g * G < s1; ++g) {
    src.begin_group(g);
    const int64_t s_end = std::min<int64_t>((g + 1) * G, s1);
    for (int64_t s = g * G; s < s_end; ++s) {
      src.prefetch(s);
      for (int i = 0; i < RM; ++i) _mm256_store_ps(panel[(s - s0) * RM + i].v, src.load(i, s));
    }
  }
  if (tail > 0)
    for (int i = 0; i < RM; ++i) _mm256_store_ps(panel[(s1 - s0) * RM + i].v, src.load_tail(i));
}

// Computes RM rows starting at r for tokens [t0, t1): for each k-chunk of at most
// kMaxChunkSteps steps, widens that chunk of the rows into `panel` (so it is hot in L1 when
// the tiles sweep it) and runs the token tiles; accumulators wait in `accs` between chunks.
template <int RM, class Source>
void panel_tiles(const Shape& sh, Source& src, const float* X, int64_t t0, int64_t t1, float* Y, int64_t r,
                 tiles::Lane8* panel, tiles::Lane8* accs) {
  const int64_t n_chunks = std::max<int64_t>(1, (sh.full_steps + kMaxChunkSteps - 1) / kMaxChunkSteps);
  // Chunks are whole groups of the source (Q8_0: 4 steps, the 256-element blocks: 32).
  constexpr int64_t kAlign = std::max(4, Source::kGroupSteps);
  const int64_t chunk_steps =
      std::max<int64_t>(kAlign, ((sh.full_steps + n_chunks - 1) / n_chunks + kAlign - 1) / kAlign * kAlign);
  for (int64_t s0 = 0;; s0 += chunk_steps) {
    const int64_t s1 = std::min(sh.full_steps, s0 + chunk_steps);
    const bool last = s1 == sh.full_steps;
    const int tail = last ? sh.tail : 0;
    pack_panel<RM>(src, s0, s1, tail, panel);
    tiles::PanelSource<RM> ps{reinterpret_cast<const float*>(panel), s0, sh.full_steps};
    for (int64_t t = t0; t < t1;) {
      // Tiles of 3 tokens; a remainder of 1 after at least one full tile becomes 2 + 2, since a
      // 1-token tile has only RM FMA chains and runs latency-bound.
      const int64_t left = t1 - t;
      const int64_t rn = left >= 3 && left != 4 ? 3 : std::min<int64_t>(left, 2);
      tiles::Lane8* acc = accs + (t - t0) * RM;  // the RM x rn accumulators of this tile
      const tiles::Lane8* in = s0 == 0 ? nullptr : acc;
      tiles::Lane8* out = last ? nullptr : acc;
      const float* x = X + t * sh.cols;
      float* y = Y + t * sh.rows + r;
      switch (rn) {
        case 3: tiles::run_tile<RM, 3>(ps, x, sh.cols, s0, s1, tail, in, out, y, sh.rows); break;
        case 2: tiles::run_tile<RM, 2>(ps, x, sh.cols, s0, s1, tail, in, out, y, sh.rows); break;
        default: tiles::run_tile<RM, 1>(ps, x, sh.cols, s0, s1, tail, in, out, y, sh.rows); break;
      }
      t += rn;
    }
    if (last) break;
  }
}

template <template <int> class Source>
void panel_rows(const Shape& sh, const float* X, int64_t n_tokens, float* Y, int64_t r0, int64_t r1) {
  const int64_t max_chunk = std::min(sh.full_steps, kMaxChunkSteps) + 4;  // + rounding, tail step
  const int64_t per_block = kTokenBlockBytes / (sh.cols * static_cast<int64_t>(sizeof(float)));
  const int64_t block_tokens = std::max<int64_t>(kTileTokens, per_block / kTileTokens * kTileTokens);
  // Per-thread scratch, grown to the largest shape seen and then reused (no per-call malloc).
  thread_local std::vector<tiles::Lane8> panel, accs;
  if (panel.size() < static_cast<size_t>(max_chunk * kPanelRows)) panel.resize(static_cast<size_t>(max_chunk * kPanelRows));
  if (accs.size() < static_cast<size_t>(block_tokens * kPanelRows)) accs.resize(static_cast<size_t>(block_tokens * kPanelRows));

  for (int64_t t0 = 0; t0 < n_tokens; t0 += block_tokens) {
    const int64_t t1 = std::min(n_tokens, t0 + block_tokens);
    for (int64_t r = r0; r < r1; r += kPanelRows) {
      with_rows(std::min<int64_t>(kPanelRows, r1 - r), [&]<int RM>() {
        Source<RM> src(sh.base + static_cast<size_t>(r) * sh.row_bytes, sh.row_bytes, sh.full_steps, sh.tail);
        panel_tiles<RM>(sh, src, X, t0, t1, Y, r, panel.data(), accs.data());
      });
    }
  }
}

template <template <int> class Source, int kMaxGroup>
void rows_for_source(const Shape& sh, const float* X, int64_t n_tokens, float* Y, int64_t r0, int64_t r1) {
  // Sources that widen blocks (Q8_0, the block types) pay their widening per token group in
  // the direct kernel: panels, which widen once per token block, win sooner.
  constexpr bool kBlocks = Source<1>::kGroupSteps > 1;
  if (n_tokens <= (kBlocks ? kDirectMaxTokensQ8 : kDirectMaxTokens)) direct_rows<Source, kMaxGroup>(sh, X, n_tokens, Y, r0, r1);
  else panel_rows<Source>(sh, X, n_tokens, Y, r0, r1);
}

template <GgmlType T>
struct Blocks {
  template <int RM>
  using Source = tiles::BlockSource<T, RM>;
};
template <GgmlType T>
struct Blocks32 {
  template <int RM>
  using Source = tiles::Block32Source<T, RM>;
};

/// matmul_rows_avx2 / matmul_rows_avx512 (kernels.h) with token groups of up to kMaxGroup.
template <int kMaxGroup>
void matmul_rows_driver(const WeightMatrix& W, const float* X, int64_t n_tokens, float* Y, int64_t row_begin,
                        int64_t row_end) {
  const Shape sh{static_cast<const unsigned char*>(W.data), weight_row_bytes(W.type, W.cols), W.rows, W.cols,
                 W.cols / 8, static_cast<int>(W.cols % 8)};
  switch (W.type) {
    case GgmlType::F32: return rows_for_source<tiles::F32Source, kMaxGroup>(sh, X, n_tokens, Y, row_begin, row_end);
    case GgmlType::F16: return rows_for_source<tiles::F16Source, kMaxGroup>(sh, X, n_tokens, Y, row_begin, row_end);
    case GgmlType::BF16: return rows_for_source<tiles::BF16Source, kMaxGroup>(sh, X, n_tokens, Y, row_begin, row_end);
    // Q8_0's direct path stops at 4 tokens, and its widening needs more registers: AVX2 groups.
    case GgmlType::Q8_0: return rows_for_source<tiles::Q8Source, 3>(sh, X, n_tokens, Y, row_begin, row_end);
#define FDL_BLOCK_CASE(T) \
  case GgmlType::T: return rows_for_source<Blocks<GgmlType::T>::Source, 3>(sh, X, n_tokens, Y, row_begin, row_end);
#define FDL_BLOCK32_CASE(T) \
  case GgmlType::T: return rows_for_source<Blocks32<GgmlType::T>::Source, 3>(sh, X, n_tokens, Y, row_begin, row_end);
    FDL_BLOCK32_CASE(Q4_0)
    FDL_BLOCK32_CASE(Q4_1)
    FDL_BLOCK32_CASE(Q5_0)
    FDL_BLOCK32_CASE(Q5_1)
#undef FDL_BLOCK32_CASE
    FDL_BLOCK_CASE(Q2_K)
    FDL_BLOCK_CASE(Q3_K)
    FDL_BLOCK_CASE(Q5_K)
#undef FDL_BLOCK_CASE
    // The types of most llama-quantize files widen in registers, as Q8_0 does; the others go
    // through a dequantized block.
    case GgmlType::Q4_K: return rows_for_source<tiles::Q4KSource, 3>(sh, X, n_tokens, Y, row_begin, row_end);
    case GgmlType::Q6_K: return rows_for_source<tiles::Q6KSource, 3>(sh, X, n_tokens, Y, row_begin, row_end);
    default: return matmul_rows_portable(W, X, n_tokens, Y, row_begin, row_end);  // validated earlier
  }
}

}  // namespace
}  // namespace fdl::cpu::detail
#endif
