// The K-quant integer kernels of q8k_kernels_avx2.h compiled with AVX-512F/VL/BW and AVX-512
// VNNI: q8k_avx512.cpp's groups of 16 tokens, each 16-bit multiply-add into the 32-bit sums one
// vpdpwssd instead of vpmaddwd + vpaddd. The integers are exact either way, so every output
// has the AVX2 build's bits (tests/cpu/matmul_test.cpp holds all three to q8k_dot_reference).
// Only called when use_avx512_vnni() is true.
#include "backend/cpu/q8k_kernels_avx2.h"

namespace fdl::cpu::detail {

#if FDL_HAVE_AVX2 && defined(__AVX512VNNI__) && defined(__AVX512VL__)
void q8k_rows_vnni(const WeightMatrix& W, const BlockQ8K* xq, int64_t n_tokens, float* Y, int64_t row_begin,
                   int64_t row_end) {
  q8k_rows_driver<16>(W, xq, n_tokens, Y, row_begin, row_end);
}
#else  // a compiler or target without AVX-512 VNNI: never dispatched to; keep the symbol defined
void q8k_rows_vnni(const WeightMatrix& W, const BlockQ8K* xq, int64_t n_tokens, float* Y, int64_t row_begin,
                   int64_t row_end) {
  q8k_rows_avx512(W, xq, n_tokens, Y, row_begin, row_end);
}
#endif

}  // namespace fdl::cpu::detail
