// AVX2/FMA matmul driver: picks the tile kernels of matmul_tiles_avx2.h per weight type and
// batch size, and blocks the multi-token case for the caches.
//
//  - Up to kDirectMaxTokens tokens (decode): weights are widened in registers as they stream
//    from memory, 4 rows at a time; the kernel is memory-bound and touches each byte once.
//  - More tokens (prefill): 4 weight rows are widened once into an fp32 panel that stays in
//    L1 while 4x3 tiles sweep a block of tokens that stays in L2; the kernel is FMA-bound.
// Both run the same per-output arithmetic (see matmul_tiles_avx2.h), so results do not
// depend on which one ran.
#include <algorithm>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/cpu/matmul_tiles_avx2.h"

namespace fdl::cpu::detail {

#if FDL_HAVE_AVX2
namespace {

using tiles::kPanelRows;

// Batches up to this size use the in-register (direct) kernel.
constexpr int64_t kDirectMaxTokens = 3;
// Tokens per tile in the panel kernel (4 rows x 3 tokens = 12 accumulators + 4 operands).
constexpr int kTileTokens = 3;
// Steps of 8 per k-chunk of the panel kernel: 4 rows x 512 fp32 = 8 KiB of panel plus
// 3 x 2 KiB of activations stay in L1 for the whole chunk. A multiple of 4 (Q8_0 blocks).
constexpr int64_t kChunkSteps = 64;
// Bytes of activations per token block of the panel kernel: small enough to stay in L2
// next to the weight stream, large enough to amortize re-widening each panel per block.
constexpr int64_t kTokenBlockBytes = 256 * 1024;

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

template <template <int> class Source>
void direct_rows(const Shape& sh, const float* X, int64_t n_tokens, float* Y, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; r += kPanelRows) {
    with_rows(std::min<int64_t>(kPanelRows, r1 - r), [&]<int RM>() {
      switch (n_tokens) {
        case 3: direct_tile<Source, RM, 3>(sh, X, Y, r); break;
        case 2: direct_tile<Source, RM, 2>(sh, X, Y, r); break;
        default: direct_tile<Source, RM, 1>(sh, X, Y, r); break;
      }
    });
  }
}

// Widens RM rows into panel[step][row] (8 floats each), zero-padding the last step.
template <int RM, class Source>
void pack_panel(Source& src, int64_t full_steps, int tail, tiles::Lane8* panel) {
  constexpr int G = Source::kGroupSteps;
  for (int64_t g = 0; g * G < full_steps; ++g) {
    src.begin_group(g);
    const int64_t s_end = std::min<int64_t>((g + 1) * G, full_steps);
    for (int64_t s = g * G; s < s_end; ++s)
      for (int i = 0; i < RM; ++i) _mm256_store_ps(panel[s * RM + i].v, src.load(i, s));
  }
  if (tail > 0)
    for (int i = 0; i < RM; ++i) _mm256_store_ps(panel[full_steps * RM + i].v, src.load_tail(i));
}

// Runs the tiles of one packed panel over tokens [t0, t1), splitting k into chunks of
// kChunkSteps when the panel is too wide for L1 (accumulators wait in `accs` in between).
template <int RM>
void panel_tiles(const Shape& sh, const tiles::Lane8* panel, const float* X, int64_t t0, int64_t t1, float* Y,
                 int64_t r, tiles::Lane8* accs) {
  tiles::PanelSource<RM> ps{reinterpret_cast<const float*>(panel), sh.full_steps};
  const int64_t n_chunks = std::max<int64_t>(1, (sh.full_steps + kChunkSteps - 1) / kChunkSteps);
  for (int64_t c = 0; c < n_chunks; ++c) {
    const int64_t s0 = c * kChunkSteps;
    const bool last = c + 1 == n_chunks;
    const int64_t s1 = last ? sh.full_steps : s0 + kChunkSteps;
    const int tail = last ? sh.tail : 0;
    for (int64_t t = t0; t < t1; t += kTileTokens) {
      tiles::Lane8* acc = accs + (t - t0) * RM;  // RM x min(3, t1-t) accumulators of this tile
      const tiles::Lane8* in = c == 0 ? nullptr : acc;
      tiles::Lane8* out = last ? nullptr : acc;
      const float* x = X + t * sh.cols;
      float* y = Y + t * sh.rows + r;
      switch (std::min<int64_t>(kTileTokens, t1 - t)) {
        case 3: tiles::run_tile<RM, 3>(ps, x, sh.cols, s0, s1, tail, in, out, y, sh.rows); break;
        case 2: tiles::run_tile<RM, 2>(ps, x, sh.cols, s0, s1, tail, in, out, y, sh.rows); break;
        default: tiles::run_tile<RM, 1>(ps, x, sh.cols, s0, s1, tail, in, out, y, sh.rows); break;
      }
    }
  }
}

template <template <int> class Source>
void panel_rows(const Shape& sh, const float* X, int64_t n_tokens, float* Y, int64_t r0, int64_t r1) {
  const int64_t steps = sh.full_steps + (sh.tail > 0 ? 1 : 0);
  const int64_t per_block = kTokenBlockBytes / (sh.cols * static_cast<int64_t>(sizeof(float)));
  const int64_t block_tokens = std::max<int64_t>(kTileTokens, per_block / kTileTokens * kTileTokens);
  // Per-thread scratch, grown to the largest shape seen and then reused (no per-call malloc).
  thread_local std::vector<tiles::Lane8> panel, accs;
  if (panel.size() < static_cast<size_t>(steps * kPanelRows)) panel.resize(static_cast<size_t>(steps * kPanelRows));
  if (accs.size() < static_cast<size_t>(block_tokens * kPanelRows)) accs.resize(static_cast<size_t>(block_tokens * kPanelRows));

  for (int64_t t0 = 0; t0 < n_tokens; t0 += block_tokens) {
    const int64_t t1 = std::min(n_tokens, t0 + block_tokens);
    for (int64_t r = r0; r < r1; r += kPanelRows) {
      with_rows(std::min<int64_t>(kPanelRows, r1 - r), [&]<int RM>() {
        Source<RM> src(sh.base + static_cast<size_t>(r) * sh.row_bytes, sh.row_bytes, sh.full_steps, sh.tail);
        pack_panel<RM>(src, sh.full_steps, sh.tail, panel.data());
        panel_tiles<RM>(sh, panel.data(), X, t0, t1, Y, r, accs.data());
      });
    }
  }
}

template <template <int> class Source>
void rows_for_source(const Shape& sh, const float* X, int64_t n_tokens, float* Y, int64_t r0, int64_t r1) {
  if (n_tokens <= kDirectMaxTokens) direct_rows<Source>(sh, X, n_tokens, Y, r0, r1);
  else panel_rows<Source>(sh, X, n_tokens, Y, r0, r1);
}

}  // namespace

void matmul_rows_avx2(const WeightMatrix& W, const float* X, int64_t n_tokens, float* Y,
                      int64_t row_begin, int64_t row_end) {
  const Shape sh{static_cast<const unsigned char*>(W.data), weight_row_bytes(W.type, W.cols), W.rows, W.cols,
                 W.cols / 8, static_cast<int>(W.cols % 8)};
  switch (W.type) {
    case GgmlType::F32: return rows_for_source<tiles::F32Source>(sh, X, n_tokens, Y, row_begin, row_end);
    case GgmlType::F16: return rows_for_source<tiles::F16Source>(sh, X, n_tokens, Y, row_begin, row_end);
    case GgmlType::BF16: return rows_for_source<tiles::BF16Source>(sh, X, n_tokens, Y, row_begin, row_end);
    case GgmlType::Q8_0: return rows_for_source<tiles::Q8Source>(sh, X, n_tokens, Y, row_begin, row_end);
    default: return matmul_rows_portable(W, X, n_tokens, Y, row_begin, row_end);  // validated earlier
  }
}
#else
void matmul_rows_avx2(const WeightMatrix& W, const float* X, int64_t n_tokens, float* Y,
                      int64_t row_begin, int64_t row_end) {
  matmul_rows_portable(W, X, n_tokens, Y, row_begin, row_end);
}
#endif

}  // namespace fdl::cpu::detail
