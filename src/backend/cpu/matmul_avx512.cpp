// AVX-512VL matmul: the driver of matmul_driver_avx2.h compiled with AVX-512F/VL enabled,
// so its 256-bit tiles can use 32 vector registers (token groups of up to 6; 4 rows x 6
// tokens = 24 accumulators). The instructions are the same 256-bit FMAs as the AVX2 build,
// on the same operands in the same order, so every output is bit-identical to it (tested in
// tests/cpu/matmul_avx512_test.cpp). Only called when use_avx512_tiles() is true.
#include "backend/cpu/matmul_driver_avx2.h"

namespace fdl::cpu::detail {

#if FDL_HAVE_AVX2 && defined(__AVX512F__) && defined(__AVX512VL__)
void matmul_rows_avx512(const WeightMatrix& W, const float* X, int64_t n_tokens, float* Y,
                        int64_t row_begin, int64_t row_end) {
  matmul_rows_driver<6>(W, X, n_tokens, Y, row_begin, row_end);
}
#else  // a compiler or target without AVX-512: never dispatched to; keep the symbol defined
void matmul_rows_avx512(const WeightMatrix& W, const float* X, int64_t n_tokens, float* Y,
                        int64_t row_begin, int64_t row_end) {
  matmul_rows_avx2(W, X, n_tokens, Y, row_begin, row_end);
}
#endif

}  // namespace fdl::cpu::detail
