// matmul.h — Y = X · Wᵀ for the weight types the engine runs (F32, F16, BF16 and the block-
// quantized types of dtype.h's block_dequantizer: Q8_0, Q4_0 ... Q6_K).
//
// Batch invariance (a hard guarantee, tested): every output Y[t][r] is bit-identical whatever
// n_tokens is, whatever the other rows of X hold, and whatever the pool's thread count is.
// Each output is reduced in one fixed order, identical in the single-token (GEMV) and
// multi-token (GEMM) kernels:
//   - weights are widened to fp32 exactly (F16/BF16 conversions are exact; a Q8_0 value is
//     d * q, whose 19 significant bits fit an fp32 mantissa, so it is exact too; the other
//     block types give their format's fp32 values, those of dequantize_row);
//   - eight lane accumulators, lane l summing the products w[k]*x[k] for k ≡ l (mod 8) in
//     increasing k (the last partial group of 8 is zero-padded);
//   - the lanes are combined as ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7)).
// The AVX2 kernels use fused multiply-add for each product; the portable kernels multiply
// then add. The two kernel sets therefore differ in the last bits, but each is batch
// invariant on its own (see cpu_features.h for how the set is chosen).
// Exception, with the AVX2 set: Q4_K, Q5_K and Q6_K run in integers against each token's
// activations quantized to 8 bits per 256-value block (q8k.h: exact int32 sums per block and
// lane, then the same float steps for every token count), as llama.cpp's CPU kernels do; the
// activations' rounding adds up to half of 1/127 of each block's largest value per product.
// A Q4_K, Q5_K, Q6_K or Q8_0 matrix in panels (WeightMatrix::panels, made only where the CPU
// has AVX-512 BW + VNNI) takes q8k_panels.h's kernels instead, whatever kernel set is forced
// (force_portable_kernels, force_avx2_tiles): the K-quants' same exact integers with one float
// step per block and row, Q8_0 against 16-bit activations.
//
// Thread-safety: matmul may run concurrently from several threads on different pools; on
// one pool, calls are serialized by the pool.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/cpu/thread_pool.h"
#include "backend/cpu/vec_ops.h"
#include "flashdllm/dtype.h"

namespace fdl::cpu {

/// A row-major weight matrix as stored in GGUF: `rows` rows of `cols` elements of ggml type
/// `type` (ggml tensor ne = {cols, rows}); rows are contiguous, no padding between them.
/// The data is only read and must outlive the call.
/// With `panels`, the same bytes hold a Q4_K/Q5_K/Q6_K/Q8_0 matrix rearranged into panels of 16 rows
/// (model/weight_panels.h rearranges a loaded model's where the AVX-512 VNNI kernels run); a view of rows
/// [16i, 16j) of it is again such a matrix.
struct WeightMatrix {
  GgmlType type;
  const void* data;
  int64_t rows;
  int64_t cols;
  bool panels = false;
};

/// Bytes of one weight row of `cols` elements of `type` (Q8_0: cols/32 blocks of 34 bytes;
/// Q4_K: cols/256 blocks of 144). Throws std::invalid_argument for unsupported types or a
/// width that is not a whole number of the type's blocks.
size_t weight_row_bytes(GgmlType type, int64_t cols);

/// Y[t*W.rows + r] = sum_k X[t*W.cols + k] * W[r][k] for t < n_tokens, r < W.rows.
/// X: fp32, n_tokens x W.cols, row-major. Y: fp32, n_tokens x W.rows, row-major; must not
/// overlap X or the weights. Work is split across the pool by weight rows, in slices of 16+
/// rows claimed by whichever thread is free (each thread streams its own slices of the
/// weights); calls estimated under a few µs of work run on the calling thread alone
/// (parallel_policy.h). Allocates
/// nothing per call once each thread's scratch has grown to the largest shape it has seen.
///
/// Kernels (AVX2): up to 16 tokens stream the weights widening them in registers, 4 rows
/// at a time, in token groups of up to 3 (from 4 tokens on, 6 with AVX-512VL's 32 registers:
/// a speculative verification of up to 6 tokens reads and widens each weight once; the same
/// arithmetic, bit-identical); more tokens widen 4
/// rows at a time into an fp32 panel in L1 and sweep it with 4x3 register tiles over
/// cache-sized token blocks (FMA-bound prefill). See matmul_driver_avx2.h.
/// Block-quantized types are widened to their fp32 values in registers step by step (Q8_0,
/// Q4_0, Q4_1, Q5_0, Q5_1; Q4_K and Q6_K in the portable set) or one block of each row at a
/// time (the others, core/quant_block_formats.h); up to 4 tokens stream them directly, more
/// pack panels. With AVX2, Q4_K, Q5_K and Q6_K take the integer kernels of q8k.h instead
/// (the activations quantized once per call by the calling thread).
/// Throws std::invalid_argument if the type is unsupported, a dimension is negative, cols is
/// not a whole number of the type's blocks, a pointer is null while its size is > 0, or W is
/// marked `panels` without a panel shape or where the panel kernels cannot run.
void matmul(ThreadPool& pool, const WeightMatrix& W, const float* X, int64_t n_tokens, float* Y);

/// Most matrices matmul_multi takes.
inline constexpr int kMaxMultiMats = 3;

/// Y[i] = X · W[i]ᵀ for i < n_mats (1..3 matrices of equal cols sharing the input: Q/K/V,
/// gate/up) in one parallel region: one hand-off and one wait instead of one per matrix.
/// With `swiglu` (n_mats == 2, equal rows) Y[0] then holds silu(Y[0]) * Y[1] (ops.h's
/// silu_mul), applied by each row slice as soon as both of its halves are done, so the
/// element-wise op is split across the pool too. Every output is bit-identical to separate
/// matmul (and silu_mul) calls; shapes and throws as matmul's.
void matmul_multi(ThreadPool& pool, const WeightMatrix* const* W, float* const* Y, int n_mats, const float* X,
                  int64_t n_tokens, bool swiglu = false);

}  // namespace fdl::cpu
