// The quantized block formats (core/quant_block_formats.h) compiled for AVX2: the same loops,
// vectorized by the compiler, the same values (this library builds without FMA contraction;
// tests/cpu/quant_blocks_test.cpp compares both builds bit for bit).
#include "backend/cpu/kernels.h"
#include "core/quant_block_formats.h"

namespace fdl::cpu::detail {

DequantizeBlockFn block_dequantizer_avx2(GgmlType t) {
  for (const auto& f : kBlockFormats)
    if (f.type == t) return f.dequantize;
  return nullptr;
}

}  // namespace fdl::cpu::detail
