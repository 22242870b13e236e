// matmul dispatcher: validates shapes, splits weight rows across the pool, and hands each
// slice to the AVX2 or portable kernel (kernels.h).
#include "backend/cpu/matmul.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/parallel_policy.h"
#include "backend/cpu/q8k.h"
#include "backend/cpu/q8k_panels.h"

namespace fdl::cpu {
namespace {

// Rows per unit of work handed to a thread. A multiple of every kernel's row tile so that
// slices only end mid-tile at the matrix edge (each output's arithmetic is the same in every
// tile shape), and of the panels' 16 rows, which the panel kernels require.
constexpr int64_t kRowGrain = 16;
static_assert(kRowGrain % detail::kPanelRows == 0, "row slices must hold whole panels");
// Row slices per pool thread. More than one lets the pool rebalance when a core is shared
// with another process (a fixed half per thread would run at the slowest thread's pace);
// slices stay large enough (>= 16 rows) to stream weights efficiently.
constexpr int kChunksPerThread = 4;
// Smallest batch that uses the AVX-512VL tiles (see matmul()), and the K-quants' integer
// kernels' groups of 16 (q8k_avx512.cpp; shorter steps have no group of 16 to gain).
constexpr int64_t kMinTokensForAvx512Tiles = 4;
constexpr int64_t kMinTokensForAvx512Q8K = 16;

void require(bool ok, const char* what) {
  if (!ok) throw std::invalid_argument(std::string("matmul: ") + what);
}

// The activations of a call as the K-quants' integer kernels read them (q8k.h), quantized
// once per call by the calling thread into its own scratch (grown, never shrunk), or null
// where no matrix of the call takes that path.
// Block-major (q8k.h: to_block_major) for the kernels.
const detail::BlockQ8K* q8k_activations(const float* X, int64_t n_tokens, int64_t cols) {
  thread_local std::vector<detail::BlockQ8K> rows, block_major;
  const auto n = static_cast<size_t>(n_tokens * (cols / 256));
  if (rows.size() < n) rows.resize(n);
  detail::quantize_rows_q8k_avx2(X, n_tokens, cols, rows.data());
  if (n_tokens == 1) return rows.data();  // one token: the same order
  if (block_major.size() < n) block_major.resize(n);
  detail::to_block_major(rows.data(), n_tokens, cols / 256, block_major.data());
  return block_major.data();
}

// The activations as the K-quant panel kernels read them (q8k_panels.h), quantized into this
// thread's own scratch.
const detail::Q8Panel* q8k_panel_activations(const float* X, int64_t n_tokens, int64_t cols) {
  thread_local std::vector<detail::BlockQ8K> rows;
  thread_local std::vector<detail::Q8Panel> panels;
  const auto n = static_cast<size_t>(n_tokens * (cols / 256));
  if (rows.size() < n) rows.resize(n);
  if (panels.size() < n) panels.resize(n);
  detail::quantize_rows_q8k_avx2(X, n_tokens, cols, rows.data());
  detail::to_panel_activations(rows.data(), n_tokens, cols / 256, panels.data());
  return panels.data();
}

// The 16-bit activations of Q8_0 matrices in panels, block-major in this thread's scratch.
const detail::Q16Panel* q16_panel_activations(const float* X, int64_t n_tokens, int64_t cols) {
  thread_local std::vector<detail::Q16Panel> blocks;
  const auto n = static_cast<size_t>(n_tokens * (cols / 256));
  if (blocks.size() < n) blocks.resize(n);
  detail::quantize_rows_q16_vnni(X, n_tokens, cols, blocks.data());
  return blocks.data();
}

// The K-quants' integer kernels for a call of n_tokens (q8k.h: all give the same bits).
using Q8kRowsFn = void (*)(const WeightMatrix&, const detail::BlockQ8K*, int64_t, float*, int64_t, int64_t);
Q8kRowsFn q8k_rows_for(int64_t n_tokens) {
  if (n_tokens < kMinTokensForAvx512Q8K || !use_avx512_tiles()) return detail::q8k_rows_avx2;
  return use_avx512_vnni() ? detail::q8k_rows_vnni : detail::q8k_rows_avx512;
}

// Rows [r0, r1) of one matrix: the integer kernels for the K-quants where the call quantized
// its activations (the AVX2 kernel set), else the kernel set's float kernels.
// Matrices in panels take the panel kernels.
struct RowsKernel {
  detail::MatmulRowsFn rows_fn;
  const detail::BlockQ8K* xq;
  const detail::Q8Panel* xp;
  const detail::Q16Panel* x16;
  void operator()(const WeightMatrix& w, const float* x, int64_t n_tokens, float* y, int64_t r0, int64_t r1) const {
    if (w.panels && w.type == GgmlType::Q8_0)
      detail::q80_panels_vnni(w, x16, n_tokens, y, r0, r1);
    else if (w.panels)
      detail::q8k_panels_vnni(w, xp, n_tokens, y, r0, r1);
    else if (xq != nullptr && detail::q8k_weight_type(w.type))
      q8k_rows_for(n_tokens)(w, xq, n_tokens, y, r0, r1);
    else
      rows_fn(w, x, n_tokens, y, r0, r1);
  }
};

// Whether a call on these matrices quantizes its activations for the integer row kernels.
bool wants_q8k(const WeightMatrix* const* W, int n_mats) {
  if (!use_avx2_kernels()) return false;
  for (int i = 0; i < n_mats; ++i)
    if (detail::q8k_weight_type(W[i]->type) && !W[i]->panels) return true;
  return false;
}

// Whether a call on these matrices runs the K-quant (q8_0 false) or Q8_0 (true) panel kernels.
// Panels exist only where prepare_weight_panels found the AVX-512 VNNI kernels usable.
bool wants_panels(const WeightMatrix* const* W, int n_mats, bool q8_0) {
  for (int i = 0; i < n_mats; ++i)
    if (W[i]->panels && (W[i]->type == GgmlType::Q8_0) == q8_0) return true;
  return false;
}


struct MatmulJob {
  RowsKernel rows_fn;
  const WeightMatrix* w;
  const float* x;
  int64_t n_tokens;
  float* y;
};

// One kernel family for every batch size: the AVX-512VL tiles are the AVX2 arithmetic
// (bit-identical, tested for every batch size), only with wider token groups, which pay
// from 4 tokens on. Below that the AVX2 build is faster: a 1-token codelm-16m step ran
// 22% slower through the AVX-512VL build (plain decode 1053 vs 1290 tok/s).
detail::MatmulRowsFn rows_fn_for(int64_t n_tokens) {
  return !use_avx2_kernels()                                          ? detail::matmul_rows_portable
         : use_avx512_tiles() && n_tokens >= kMinTokensForAvx512Tiles ? detail::matmul_rows_avx512
                                                                      : detail::matmul_rows_avx2;
}

// The kernel of a call: its activations quantized once, by the calling thread.
RowsKernel rows_kernel_for(const WeightMatrix* const* W, int n_mats, const float* X, int64_t n_tokens) {
  const int64_t cols = W[0]->cols;
  for (int i = 0; i < n_mats; ++i)
    if (W[i]->panels) {
      WeightMatrix rows = *W[i];
      rows.panels = false;
      require(detail::panels_fit(rows) && use_avx512_vnni(),
              "a matrix marked as panels without a panel shape, or without the AVX-512 VNNI kernels to run it");
    }
  return RowsKernel{rows_fn_for(n_tokens), wants_q8k(W, n_mats) ? q8k_activations(X, n_tokens, cols) : nullptr,
                    wants_panels(W, n_mats, false) ? q8k_panel_activations(X, n_tokens, cols) : nullptr,
                    wants_panels(W, n_mats, true) ? q16_panel_activations(X, n_tokens, cols) : nullptr};
}

}  // namespace

size_t weight_row_bytes(GgmlType type, int64_t cols) {
  if (cols < 0) throw std::invalid_argument("weight_row_bytes: negative column count");
  if (!is_supported_weight_type(type))
    throw std::invalid_argument("unsupported weight type " + ggml_type_name(static_cast<uint32_t>(type)) +
                                " (supported: " + std::string(supported_weight_types()) + ")");
  const GgmlTypeTraits t = *ggml_type_traits(static_cast<uint32_t>(type));
  const auto n = static_cast<size_t>(cols);
  if (n % t.block_size != 0)
    throw std::invalid_argument("weight_row_bytes: " + std::string(t.name) + " row length " + std::to_string(n) +
                                " is not a multiple of " + std::to_string(t.block_size));
  return n / t.block_size * t.type_size;
}

void matmul(ThreadPool& pool, const WeightMatrix& W, const float* X, int64_t n_tokens, float* Y) {
  require(W.rows >= 0 && W.cols >= 0 && n_tokens >= 0, "negative dimension");
  (void)weight_row_bytes(W.type, W.cols);  // validates the type and that rows are whole blocks
  if (W.rows == 0 || n_tokens == 0) return;
  require(Y != nullptr, "null output");
  if (W.cols == 0) {  // empty sums
    std::fill(Y, Y + n_tokens * W.rows, 0.f);
    return;
  }
  require(W.data != nullptr && X != nullptr, "null weights or input");

  const WeightMatrix* const one[] = {&W};
  const MatmulJob job{rows_kernel_for(one, 1, X, n_tokens), &W, X, n_tokens, Y};
  const int64_t n_units = (W.rows + kRowGrain - 1) / kRowGrain;
  // Capturing one pointer keeps the std::function in its small buffer: no allocation.
  const MatmulJob* jp = &job;
  // Small calls run on the calling thread alone (parallel_policy.h: decided by estimated
  // time, not token count). The split never changes results (batch invariance).
  if (!worth_splitting(pool, matmul_cost_ns(W, n_tokens))) {
    job.rows_fn(W, X, n_tokens, Y, 0, W.rows);
    return;
  }
  pool.parallel_for(
      n_units,
      [jp](int64_t u0, int64_t u1, int) {
        const int64_t r0 = u0 * kRowGrain;
        const int64_t r1 = std::min(u1 * kRowGrain, jp->w->rows);
        jp->rows_fn(*jp->w, jp->x, jp->n_tokens, jp->y, r0, r1);
      },
      kChunksPerThread);
}

void matmul_multi(ThreadPool& pool, const WeightMatrix* const* W, float* const* Y, int n_mats, const float* X,
                  int64_t n_tokens, bool swiglu) {
  require(n_mats >= 1 && n_mats <= kMaxMultiMats, "matmul_multi takes 1 to 3 matrices");
  require(!swiglu || (n_mats == 2 && W[0]->rows == W[1]->rows), "swiglu needs two matrices of equal rows");
  double cost = 0;
  for (int i = 0; i < n_mats; ++i) {
    require(W[i]->cols == W[0]->cols, "matmul_multi matrices differ in width");
    cost += matmul_cost_ns(*W[i], n_tokens);  // also validates the type
  }
  // Degenerate shapes, or too little work to split: plain calls (each validates itself).
  if (n_tokens <= 0 || W[0]->cols == 0 || !worth_splitting(pool, cost)) {
    for (int i = 0; i < n_mats; ++i) matmul(pool, *W[i], X, n_tokens, Y[i]);
    if (swiglu && n_tokens > 0) silu_mul(Y[0], Y[1], Y[0], n_tokens * W[0]->rows);
    return;
  }
  require(X != nullptr, "null input");
  for (int i = 0; i < n_mats; ++i) require(W[i]->data != nullptr && Y[i] != nullptr, "null weights or output");

  // Row units of all matrices, numbered matrix after matrix; with swiglu a unit covers the
  // same rows of gate and up, and applies silu(gate) * up to them once both are done.
  struct Job {
    RowsKernel rows_fn;
    const WeightMatrix* const* w;
    float* const* y;
    int n_mats;
    const float* x;
    int64_t n_tokens;
    bool swiglu;
    int64_t first_unit[kMaxMultiMats + 1];
  } job{rows_kernel_for(W, n_mats, X, n_tokens), W, Y, swiglu ? 1 : n_mats, X, n_tokens, swiglu, {}};
  for (int i = 0; i < job.n_mats; ++i) job.first_unit[i + 1] = job.first_unit[i] + (W[i]->rows + kRowGrain - 1) / kRowGrain;
  const Job* jp = &job;
  pool.parallel_for(
      job.first_unit[job.n_mats],
      [jp](int64_t u0, int64_t u1, int) {
        for (int i = 0; i < jp->n_mats; ++i) {
          const int64_t a = std::max(u0, jp->first_unit[i]), b = std::min(u1, jp->first_unit[i + 1]);
          if (a >= b) continue;
          const WeightMatrix& w = *jp->w[i];
          const int64_t r0 = (a - jp->first_unit[i]) * kRowGrain;
          const int64_t r1 = std::min((b - jp->first_unit[i]) * kRowGrain, w.rows);
          jp->rows_fn(w, jp->x, jp->n_tokens, jp->y[i], r0, r1);
          if (jp->swiglu) {
            jp->rows_fn(*jp->w[1], jp->x, jp->n_tokens, jp->y[1], r0, r1);
            for (int64_t t = 0; t < jp->n_tokens; ++t) {
              float* g = jp->y[0] + t * w.rows;
              silu_mul(g + r0, jp->y[1] + t * w.rows + r0, g + r0, r1 - r0);
            }
          }
        }
      },
      kChunksPerThread);
}

}  // namespace fdl::cpu
