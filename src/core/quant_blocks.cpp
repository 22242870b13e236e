// The quantized block formats (quant_block_formats.h) as the portable build computes them.
#include "core/quant_block_formats.h"

namespace fdl {

DequantizeBlockFn block_dequantizer(GgmlType t) {
  for (const auto& f : kBlockFormats)
    if (f.type == t) return f.dequantize;
  return nullptr;
}

}  // namespace fdl
