// AVX2/FMA matmul: the driver of matmul_driver_avx2.h with AVX2's 16 vector registers
// (token groups of up to 3).
#include "backend/cpu/matmul_driver_avx2.h"

namespace fdl::cpu::detail {

#if FDL_HAVE_AVX2
void matmul_rows_avx2(const WeightMatrix& W, const float* X, int64_t n_tokens, float* Y,
                      int64_t row_begin, int64_t row_end) {
  matmul_rows_driver<3>(W, X, n_tokens, Y, row_begin, row_end);
}
#else
void matmul_rows_avx2(const WeightMatrix& W, const float* X, int64_t n_tokens, float* Y,
                      int64_t row_begin, int64_t row_end) {
  matmul_rows_portable(W, X, n_tokens, Y, row_begin, row_end);
}
#endif

}  // namespace fdl::cpu::detail
