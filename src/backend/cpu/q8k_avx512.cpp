// The K-quant integer kernels of q8k_kernels_avx2.h compiled with AVX-512F/VL enabled: the same
// 256-bit instructions on the same operands in the same order as the AVX2 build, so every
// output has its bits (tests/cpu/matmul_test.cpp holds both to q8k_dot_reference), but 32
// vector registers hold the accumulators of 16 tokens, so each weight block is unpacked once
// per 16 tokens instead of 8. Only called when use_avx512_tiles() is true.
#include "backend/cpu/q8k_kernels_avx2.h"

namespace fdl::cpu::detail {

#if FDL_HAVE_AVX2 && defined(__AVX512F__) && defined(__AVX512VL__)
void q8k_rows_avx512(const WeightMatrix& W, const BlockQ8K* xq, int64_t n_tokens, float* Y, int64_t row_begin,
                     int64_t row_end) {
  q8k_rows_driver<16>(W, xq, n_tokens, Y, row_begin, row_end);
}
#else  // a compiler or target without AVX-512: never dispatched to; keep the symbol defined
void q8k_rows_avx512(const WeightMatrix& W, const BlockQ8K* xq, int64_t n_tokens, float* Y, int64_t row_begin,
                     int64_t row_end) {
  q8k_rows_avx2(W, xq, n_tokens, Y, row_begin, row_end);
}
#endif

}  // namespace fdl::cpu::detail
