// matmul dispatcher: validates shapes, splits weight rows across the pool, and hands each
// slice to the AVX2 or portable kernel (kernels.h).
#include "backend/cpu/matmul.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/kernels.h"

namespace fdl::cpu {
namespace {

// Rows per unit of work handed to a thread. A multiple of every kernel's row tile so that
// slices only end mid-tile at the matrix edge (correctness does not depend on it: each
// output's arithmetic is the same in every tile shape).
constexpr int64_t kRowGrain = 16;
// Below this many multiply-adds a matmul runs on the calling thread alone: waking workers
// (~1 µs) would cost more than it saves (tiny models such as stories260K). The split never
// changes results (batch invariance holds for any thread count).
constexpr int64_t kMinParallelMacs = int64_t{1} << 16;
// Row slices per pool thread. More than one lets the pool rebalance when a core is shared
// with another process (a fixed half per thread would run at the slowest thread's pace);
// slices stay large enough (>= 16 rows) to stream weights efficiently.
constexpr int kChunksPerThread = 4;
// Smallest batch that uses the AVX-512VL tiles (see matmul()).
constexpr int64_t kMinTokensForAvx512Tiles = 4;

void require(bool ok, const char* what) {
  if (!ok) throw std::invalid_argument(std::string("matmul: ") + what);
}

struct MatmulJob {
  detail::MatmulRowsFn rows_fn;
  const WeightMatrix* w;
  const float* x;
  int64_t n_tokens;
  float* y;
};

}  // namespace

size_t weight_row_bytes(GgmlType type, int64_t cols) {
  if (cols < 0) throw std::invalid_argument("weight_row_bytes: negative column count");
  const auto n = static_cast<size_t>(cols);
  switch (type) {
    case GgmlType::F32: return n * 4;
    case GgmlType::F16:
    case GgmlType::BF16: return n * 2;
    case GgmlType::Q8_0:
      if (n % 32 != 0)
        throw std::invalid_argument("weight_row_bytes: Q8_0 row length " + std::to_string(n) +
                                    " is not a multiple of 32");
      return n / 32 * sizeof(BlockQ8_0);
    default:
      throw std::invalid_argument("unsupported weight type " +
                                  ggml_type_name(static_cast<uint32_t>(type)) + " (supported: " +
                                  std::string(supported_weight_types()) + ")");
  }
}

void matmul(ThreadPool& pool, const WeightMatrix& W, const float* X, int64_t n_tokens, float* Y) {
  require(W.rows >= 0 && W.cols >= 0 && n_tokens >= 0, "negative dimension");
  (void)weight_row_bytes(W.type, W.cols);  // validates type and Q8_0 width
  if (W.rows == 0 || n_tokens == 0) return;
  require(Y != nullptr, "null output");
  if (W.cols == 0) {  // empty sums
    std::fill(Y, Y + n_tokens * W.rows, 0.f);
    return;
  }
  require(W.data != nullptr && X != nullptr, "null weights or input");

  // One kernel family for every batch size: the AVX-512VL tiles are the AVX2 arithmetic
  // (bit-identical, tested for every batch size), only with wider token groups, which pay
  // from 4 tokens on. Below that the AVX2 build is faster: a 1-token codelm-16m step ran
  // 22% slower through the AVX-512VL build (plain decode 1053 vs 1290 tok/s).
  const detail::MatmulRowsFn rows_fn =
      !use_avx2_kernels()                                          ? detail::matmul_rows_portable
      : use_avx512_tiles() && n_tokens >= kMinTokensForAvx512Tiles ? detail::matmul_rows_avx512
                                                                   : detail::matmul_rows_avx2;
  const MatmulJob job{rows_fn, &W, X, n_tokens, Y};
  const int64_t n_units = (W.rows + kRowGrain - 1) / kRowGrain;
  // Capturing one pointer keeps the std::function in its small buffer: no allocation.
  const MatmulJob* jp = &job;
  if (W.rows * W.cols * n_tokens < kMinParallelMacs) {
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

}  // namespace fdl::cpu
