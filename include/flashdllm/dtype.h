// flashdllm/dtype.h — ggml tensor types as stored in GGUF files, and scalar conversions.
//
// Type ids and block layouts follow ggml's `enum ggml_type` (ggml/include/ggml.h) as
// referenced by the GGUF spec (ggml docs/gguf.md). A "block" is the unit of quantization:
// `block_size` elements occupy `type_size` bytes (F32: 1 element / 4 bytes; Q8_0: 32 elements /
// 34 bytes = one fp16 scale + 32 int8).
//
// Thread-safety: all functions are pure and thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace fdl {

/// ggml type ids (values are part of the GGUF file format; never renumber).
enum class GgmlType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22,
  IQ4_XS = 23, I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30,
  TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39,
};

struct GgmlTypeTraits {
  std::string_view name;  ///< ggml's name, e.g. "F16", "Q8_0"
  uint32_t block_size;    ///< elements per block
  uint32_t type_size;     ///< bytes per block
};

/// Traits of a known ggml type id; std::nullopt for an id this build does not know
/// (e.g. removed ids 4/5, or anything newer than the table).
std::optional<GgmlTypeTraits> ggml_type_traits(uint32_t type_id);

/// Name of a type for messages ("F16", or "type#42" when unknown).
std::string ggml_type_name(uint32_t type_id);

/// Turns one block of a quantized type (ggml_type_traits(t)->type_size bytes) into its
/// block_size fp32 values, exactly as the format defines them (src/core/quant_blocks.cpp).
/// Pure; thread-safe.
using DequantizeBlockFn = void (*)(const void* block, float* out);

/// The block dequantizer of a quantized type this build computes with (Q4_0, Q4_1, Q5_0, Q5_1,
/// Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K); nullptr for any other type.
DequantizeBlockFn block_dequantizer(GgmlType t);

/// Types the compute backends can run: F32, F16, BF16 and the block_dequantizer() types.
bool is_supported_weight_type(GgmlType t);
/// Comma-separated list of supported weight types, for error messages.
std::string_view supported_weight_types();

/// Q8_0 block: 32 int8 values sharing one fp16 scale (ggml `block_q8_0`).
struct BlockQ8_0 {
  uint16_t d;      ///< fp16 scale
  int8_t qs[32];   ///< value = d * qs[i]
};
static_assert(sizeof(BlockQ8_0) == 34);

/// IEEE fp16 <-> fp32. Round-to-nearest-even on narrowing; NaN/Inf preserved.
float fp16_to_fp32(uint16_t h);
uint16_t fp32_to_fp16(float f);

/// bfloat16 <-> fp32 (bf16 is the top 16 bits of fp32; narrowing rounds to nearest even,
/// NaN stays NaN).
inline float bf16_to_fp32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t fp32_to_bf16(float f);

/// Dequantize `n` elements (n a multiple of the type's block size) of a row of type `t` into
/// fp32. Supported: every is_supported_weight_type() type. Throws std::invalid_argument for
/// other types, or an n that is not a whole number of blocks.
void dequantize_row(GgmlType t, const void* src, float* dst, size_t n);

/// Whether quantize_row writes type t: every block_dequantizer() type.
bool has_quantizer(GgmlType t);

/// Quantizes `n` fp32 values (a whole number of t's blocks) into t's block format, the layout
/// block_dequantizer(t) reads (src/core/quantize_blocks.cpp): per block, or per group of a
/// K-quant super-block, a scale (and an offset, for the formats with a minimum) from the
/// values' range, rounded to its stored precision, then each value rounded to the nearest
/// level. Plain round-to-nearest, not llama.cpp's search for the least-error scale, so the
/// error is somewhat larger than llama-quantize's; meant for random test weights (make-model).
/// Throws std::invalid_argument for a type without a quantizer or an n that is not whole
/// blocks. Pure; thread-safe.
void quantize_row(GgmlType t, const float* src, void* dst, size_t n);

/// Quantize `n` fp32 values (multiple of 32) to Q8_0 the way ggml's reference
/// `quantize_row_q8_0_ref` does (scale = max|x|/127, round to nearest).
void quantize_row_q8_0(const float* src, BlockQ8_0* dst, size_t n);

}  // namespace fdl
