// q8k.h — internal: integer dot products of the K-quant weight types (Q4_K, Q5_K, Q6_K) with
// activations quantized to 8 bits per 256-element block (the Q8_K scheme llama.cpp's CPU
// kernels use), for the AVX2 kernel set.
//
// Arithmetic (the same for every token count, so matmul stays batch-invariant):
//   - each token's activation row is quantized on its own, block by block: d = max|x| / 127,
//     q = round(x / d) (ties away from zero), plus each 16 values' sum of q;
//   - per weight block b and lane j < 8 (the elements i with (i % 32) / 4 == j: the 32-bit
//     lanes of the AVX2 sums), an exact int32 sum of level x q products weighted by their
//     group's integer scale, and the lane's share of the minimums (Q4_K, Q5_K: m[j] times
//     group j's q sum) or of Q6_K's -32 offset (scales and q sums of groups 2j, 2j + 1); then
//     per lane, in block order:
//       lane_j += (d_w * d_x) * isum_j - (dmin_w * d_x) * msum_j     (Q4_K, Q5_K)
//       lane_j += (d_w * d_x) * (isum_j - 32 * offset_j)              (Q6_K)
//     and the eight lanes combined as the float kernels combine theirs (matmul.h).
// Compared with fp32 activations (the other types' kernels), the activations' rounding adds a
// relative error of up to 1/254 of each block's largest value to every product.
// The inline helpers below are `static`: the *_avx512 / *_vnni files compile them with
// AVX-512 enabled, and an out-of-line copy the linker could share with the AVX2 or portable
// callers (a build without inlining) might hold AVX-512 instructions.
#pragma once

#include <cstdint>
#include <cstring>

#include "backend/cpu/matmul.h"
#include "flashdllm/dtype.h"

namespace fdl::cpu::detail {

/// One 256-element block of a quantized activation row.
struct BlockQ8K {
  float d;             ///< scale: value = d * qs[i]
  int8_t qs[256];      ///< in [-127, 127]
  int16_t bsums[16];   ///< sum of qs[16j .. 16j + 15]
};

/// The fp16 at p (a block's unaligned d or dmin) as a float.
static inline float half_at(const unsigned char* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return fp16_to_fp32(h);
}

/// Q4_K / Q5_K's 6-bit scale and minimum of each 32-element group, from the block's 12 bytes
/// at p (GGUF's K-quant layout).
static inline void k4_scales(const unsigned char* p, int (&sc)[8], int (&m)[8]) {
  for (int j = 0; j < 4; ++j) sc[j] = p[j] & 63, m[j] = p[j + 4] & 63;
  for (int j = 4; j < 8; ++j) {
    sc[j] = (p[j + 4] & 0x0f) | ((p[j - 4] >> 6) << 4);
    m[j] = (p[j + 4] >> 4) | ((p[j] >> 6) << 4);
  }
}

/// A row's eight lane totals combined in matmul.h's order.
static inline float combine_lanes(const float (&l)[8]) { return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7])); }

/// Whether matmul runs `t` through these integer dot products (with the AVX2 kernel set).
static inline bool q8k_weight_type(GgmlType t) { return t == GgmlType::Q4_K || t == GgmlType::Q5_K || t == GgmlType::Q6_K; }

/// Quantizes n_tokens rows of `cols` floats (cols a multiple of 256) into cols / 256 blocks
/// each, row after row (q = x * (127 / max|x|) rounded to nearest, ties to even). Pure;
/// thread-safe. The AVX2 build gives the same bytes (only call it when use_avx2_kernels()).
void quantize_rows_q8k(const float* x, int64_t n_tokens, int64_t cols, BlockQ8K* out);
void quantize_rows_q8k_avx2(const float* x, int64_t n_tokens, int64_t cols, BlockQ8K* out);

/// Y[t * W.rows + r] for t < n_tokens, r in [row_begin, row_end): W (Q4_K, Q5_K or Q6_K)
/// against the quantized activations xq, block-major: block b of token t at
/// xq[b * n_tokens + t] (to_block_major), so a group of tokens' blocks lie at fixed offsets.
/// AVX2; only call when use_avx2_kernels() is true.
void q8k_rows_avx2(const WeightMatrix& W, const BlockQ8K* xq, int64_t n_tokens, float* Y, int64_t row_begin,
                   int64_t row_end);
/// The same outputs, bit for bit, with token groups of up to 16 (AVX-512F/VL's 32 vector
/// registers); only call when use_avx512_tiles() is true.
void q8k_rows_avx512(const WeightMatrix& W, const BlockQ8K* xq, int64_t n_tokens, float* Y, int64_t row_begin,
                     int64_t row_end);
/// The same outputs, bit for bit, with AVX-512 VNNI's vpdpwssd; only call when
/// use_avx512_vnni() is true.
void q8k_rows_vnni(const WeightMatrix& W, const BlockQ8K* xq, int64_t n_tokens, float* Y, int64_t row_begin,
                   int64_t row_end);

/// Rearranges n_tokens rows of nb blocks each (quantize_rows_q8k's order) block-major into out.
static inline void to_block_major(const BlockQ8K* rows, int64_t n_tokens, int64_t nb, BlockQ8K* out) {
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int64_t b = 0; b < nb; ++b) out[b * n_tokens + t] = rows[t * nb + b];
}

/// The same sums block by block in plain C++: the reference the tests hold the AVX2 code to
/// (the integer sums are exact, so the two agree bit for bit).
float q8k_dot_reference(GgmlType t, const unsigned char* w_row, const BlockQ8K* x_row, int64_t n_blocks);

}  // namespace fdl::cpu::detail
