// q8k_panels.h — internal: block-quantized weight matrices (Q4_K, Q5_K, Q6_K and Q8_0)
// rearranged in place into panels of 16 rows for the AVX-512 VNNI kernels
// (q8k_panels_vnni.cpp for the K-quants, q80_panels_vnni.cpp for Q8_0), and the arithmetic
// those kernels share with the reference dot products below.
//
// Why panels: vpdpbusd multiplies 4 unsigned 8-bit weights by 4 signed 8-bit activations
// into each 32-bit lane, 64 products per instruction. With one weight row per lane (16 rows
// per 512-bit vector) a token's 4 activations are one broadcast, the lanes never need a
// horizontal sum, and a block's per-row scales are one vector: one kernel serves a decode
// token and a prefill group of 8 alike, reading each weight once per group.
//
// Layout. A matrix of R rows (R % 16 == 0) and C columns (C % 256 == 0) keeps its bytes and
// its size; panel p (rows 16p .. 16p + 15) keeps the byte range the rows had, as nb = C / 256
// panel blocks in block order, panel block b holding the 16 rows' block b (16 x the type's
// block bytes). Element k of a block, row r (< 16), level u (GGUF's unsigned level: Q4_K
// 0-15, Q5_K 0-31, Q6_K 0-63, the value q + 32):
//   nibbles, bytes [0, 2048): 32 steps s of 8 elements (k = 8s .. 8s + 7), 64 bytes each;
//     byte 4r + j (j < 4) = (u(r, 8s + j) & 15) | (u(r, 8s + 4 + j) & 15) << 4;
//   Q5_K: bytes [2048, 2560): per step two 64-bit masks, bit 4r + j of mask h (h = 0: element
//     8s + j; h = 1: element 8s + 4 + j) = bit 4 of u;
//   Q6_K: bytes [2048, 3072): per step four 64-bit masks, [half h][bit b]: bit 4r + j = bit
//     4 + b of u(r, 8s + 4h + j);
//   Q4_K / Q5_K: the rows' 12 scale bytes as 3 little-endian words, word w of row r at
//     64w + 4r (192 bytes), then the 16 d (fp16), then the 16 dmin;
//   Q6_K: the 16 int8 scales, scale g of row r at 16g + r (256 bytes), then the 16 d.
//
//   Q8_0: a panel block covers 256 columns, the rows' eight 32-value blocks g: bytes
//     [512g, 512g + 512): 16 steps s of 2 elements, 32 bytes each, byte 2r + j = the int8
//     weight (r, 32g + 2s + j); then at 4096 + 32g + 2r the fp16 d of row r's block g.
//     (4352 bytes: 16 x 8 x 34.)
//
// Arithmetic, per weight row and token (the same for every token count and group, so matmul
// stays batch-invariant): per block b, in block order, with the activations' Q8_K block x
// (q8k.h) and exact int32 sums
//   Q4_K / Q5_K: S = sum_g sc_g * sum_{k in g} u_k * q_k,  M = sum_g m_g * sum_{k in g} q_k,
//                acc = acc + ((d * x.d) * float(S) - (dmin * x.d) * float(M));
//   Q6_K:        S = sum_g sc_g * sum_{k in g} (u_k - 32) * q_k,
//                acc = acc + (d * x.d) * float(S);
// every float operation rounded as written (no fused multiply-add), acc starting at 0.
// Q8_0 keeps its 8-bit weights exact against 16-bit activations (Q16Panel: one scale per 256
// values, 1/65534 of the block's largest value per rounding, far finer than llama.cpp's 8-bit
// Q8_0 activations), one vpdpwssd per 2 products: per 256-value block, per 32-value block g
// in order, with the exact int32 I = sum_{k in g} w_k * q_k,
//   acc = fma(d_g * x.d, float(I), acc)     (one rounding: a fused multiply-add).
// The sums fit int32 (|S| < 2^29 for Q6_K's 16 groups of 16). This is not the row kernels'
// arithmetic (q8k.h: eight lanes per row), so a matrix in panels gives other last bits than
// the same matrix in rows; each is batch-invariant on its own.
//
// Thread-safety: everything here is pure on its arguments.
#pragma once

#include <cstdint>

#include "backend/cpu/matmul.h"
#include "backend/cpu/q8k.h"
#include "flashdllm/dtype.h"

namespace fdl::cpu::detail {

/// Rows per panel.
inline constexpr int64_t kPanelRows = 16;

/// Whether type t has a panel layout: Q4_K, Q5_K, Q6_K or Q8_0.
bool panel_type(GgmlType t);
/// Whether W can be rearranged into panels: a panel type, rows a multiple of 16, columns a
/// multiple of 256, and not already in panels.
bool panels_fit(const WeightMatrix& W);

/// Rearranges `rows` x `cols` weights of `type` at `data` from GGUF rows into panels, in place
/// (the same bytes count). Throws std::invalid_argument where panels_fit would be false.
void to_panels(GgmlType type, uint8_t* data, int64_t rows, int64_t cols);
/// The inverse: panels back to GGUF rows, in place.
void from_panels(GgmlType type, uint8_t* data, int64_t rows, int64_t cols);

/// One token's 256-value activation block as the panel kernels read it: the Q8_K block's
/// integers and scale, and the sums the formats' offsets need, precomputed once per call.
struct Q8Panel {
  int8_t qs[256];
  float d;
  /// Q4_K / Q5_K: groups 2j and 2j + 1's sums of qs (32 values each) as two int16, the low
  /// half group 2j: vpdpwssd's operand for the minimums.
  int32_t min_pairs[4];
  /// Q6_K: 32 * the sum of qs over each group of 16 values (the levels' +32).
  int32_t offsets[16];
};

/// Converts n_tokens rows of nb Q8_K blocks (quantize_rows_q8k's order) into panel blocks,
/// block-major: block b of token t at out[b * n_tokens + t].
void to_panel_activations(const BlockQ8K* rows, int64_t n_tokens, int64_t nb, Q8Panel* out);

/// Row r (< 16) of panel `panel` (a K-quant matrix's panel of nb blocks) against one token's nb
/// blocks, in plain C++: the arithmetic above, which the kernels give bit for bit.
float q8k_panel_dot_reference(GgmlType type, const uint8_t* panel, int64_t nb, int r, const BlockQ8K* x_row);

/// One token's 256 activations as Q8_0 panels read them: d * qs[i], qs in [-32767, 32767].
struct Q16Panel {
  int16_t qs[256];
  float d;
};
/// Quantizes n_tokens rows of `cols` floats (cols a multiple of 256) block-major into out
/// (block b of token t at out[b * n_tokens + t]): d = max|x| / 32767, q = x * (32767 / max|x|)
/// rounded to nearest even (a block of zeros: d = 0; a NaN or infinite value: d NaN, q 0).
void quantize_rows_q16(const float* x, int64_t n_tokens, int64_t cols, Q16Panel* out);
/// The same bytes with AVX-512 BW; only call when use_avx512_vnni() is true.
void quantize_rows_q16_vnni(const float* x, int64_t n_tokens, int64_t cols, Q16Panel* out);
/// Row r (< 16) of a Q8_0 panel of nb blocks of 256 against one token's blocks x[b * ld].
float q80_panel_dot_reference(const uint8_t* panel, int64_t nb, int r, const Q16Panel* x, int64_t ld);

/// Throws std::invalid_argument naming `kernel` unless [row_begin, row_end) is whole panels of
/// a matrix of `rows` rows (a multiple of 16). Outside the kernels' files: they are compiled
/// with AVX-512, the string code of an error message must not be.
void check_panel_rows(const char* kernel, int64_t rows, int64_t row_begin, int64_t row_end);

/// Y[t * W.rows + r] for t < n_tokens, r in [row_begin, row_end) (multiples of 16; W.rows a
/// multiple of 16): W in panels against the block-major activations xp (to_panel_activations).
/// AVX-512 BW + VNNI; only call when use_avx512_vnni() is true.
void q8k_panels_vnni(const WeightMatrix& W, const Q8Panel* xp, int64_t n_tokens, float* Y, int64_t row_begin,
                     int64_t row_end);
/// The same for a Q8_0 W in panels against quantize_rows_q16's activations.
void q80_panels_vnni(const WeightMatrix& W, const Q16Panel* xp, int64_t n_tokens, float* Y, int64_t row_begin,
                     int64_t row_end);

}  // namespace fdl::cpu::detail
