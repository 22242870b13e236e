// quant_block_formats.h — internal: the quantized block formats of GGUF files, one row per
// type (how a block turns into fp32), shared by the portable build (quant_blocks.cpp) and the
// CPU backend's AVX2 build (backend/cpu/dequant_avx2.cpp), which compiles the same loops for
// wider vectors. Include only from those .cpp files: everything here has internal linkage, so
// each gets its own copy for its own ISA.
//
// Layouts and value formulas follow ggml's block formats as GGUF stores them (ggml's
// ggml-common.h structs; the GGUF spec names the types). Values are computed in fp32 in the
// order the formats define (d * q, then - m for the formats with a minimum); includers build
// without FMA contraction (-ffp-contract=off), so that every build gives the same floats (a
// vectorized multiply or subtract rounds as the scalar one does).
#pragma once

#include <cstdint>
#include <cstring>

#include "flashdllm/dtype.h"

namespace fdl {
namespace {

float half(const unsigned char* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return fp16_to_fp32(h);
}

// Q4_0: d (fp16), 16 bytes of 4-bit q; element j (< 16) is the low nibble of byte j, element
// j + 16 its high nibble; value (q - 8) * d.
void dequantize_q4_0(const void* block, float* y) {
  const auto* b = static_cast<const unsigned char*>(block);
  const float d = half(b);
  const unsigned char* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>((qs[j] & 0x0f) - 8) * d;
    y[j + 16] = static_cast<float>((qs[j] >> 4) - 8) * d;
  }
}

// Q4_1: d, m (fp16), 16 bytes of nibbles as Q4_0; value q * d + m.
void dequantize_q4_1(const void* block, float* y) {
  const auto* b = static_cast<const unsigned char*>(block);
  const float d = half(b), m = half(b + 2);
  const unsigned char* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>(qs[j] & 0x0f) * d + m;
    y[j + 16] = static_cast<float>(qs[j] >> 4) * d + m;
  }
}

// The fifth bits of Q5_0 / Q5_1: bit j of the 32-bit qh is element j's.
uint32_t high_bits(const unsigned char* p) {
  uint32_t qh;
  std::memcpy(&qh, p, 4);
  return qh;
}

// Q5_0: d (fp16), qh (32 fifth bits), 16 bytes of nibbles; value (q - 16) * d.
void dequantize_q5_0(const void* block, float* y) {
  const auto* b = static_cast<const unsigned char*>(block);
  const float d = half(b);
  const uint32_t qh = high_bits(b + 2);
  const unsigned char* qs = b + 6;
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 0x0f) | static_cast<int>(((qh >> j) & 1u) << 4);
    const int hi = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
    y[j] = static_cast<float>(lo - 16) * d;
    y[j + 16] = static_cast<float>(hi - 16) * d;
  }
}

// Q5_1: d, m (fp16), qh, 16 bytes of nibbles; value q * d + m.
void dequantize_q5_1(const void* block, float* y) {
  const auto* b = static_cast<const unsigned char*>(block);
  const float d = half(b), m = half(b + 2);
  const uint32_t qh = high_bits(b + 4);
  const unsigned char* qs = b + 8;
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 0x0f) | static_cast<int>(((qh >> j) & 1u) << 4);
    const int hi = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
    y[j] = static_cast<float>(lo) * d + m;
    y[j + 16] = static_cast<float>(hi) * d + m;
  }
}

// Q8_0: d (fp16), 32 int8; value q * d (exact in fp32).
void dequantize_q8_0(const void* block, float* y) {
  const auto* b = static_cast<const unsigned char*>(block);
  const float d = half(b);
  for (int j = 0; j < 32; ++j) y[j] = d * static_cast<float>(static_cast<int8_t>(b[2 + j]));
}

// Q2_K: 16 bytes of 4-bit (scale | min << 4) per 16 elements, 64 bytes of 2-bit q, d and dmin
// (fp16). Elements 128h + 32s + l (l < 32) hold bits 2s, 2s + 1 of byte 32h + l; their
// 16-element group is 8h + 2s + l / 16. Value (d * scale) * q - (dmin * min).
void dequantize_q2_k(const void* block, float* y) {
  const auto* b = static_cast<const unsigned char*>(block);
  const unsigned char* scales = b;
  const unsigned char* qs = b + 16;
  const float d = half(b + 80), dmin = half(b + 82);
  for (int h = 0; h < 2; ++h)
    for (int s = 0; s < 4; ++s)
      for (int g = 0; g < 2; ++g) {  // 16 elements per scale
        const int sc = scales[8 * h + 2 * s + g];
        const float dl = d * static_cast<float>(sc & 0x0f), ml = dmin * static_cast<float>(sc >> 4);
        for (int l = 16 * g; l < 16 * g + 16; ++l) {
          const int q = (qs[32 * h + l] >> (2 * s)) & 3;
          y[128 * h + 32 * s + l] = dl * static_cast<float>(q) - ml;
        }
      }
}

// Q3_K: 32 bytes of high bits (hmask), 64 bytes of 2-bit q as Q2_K, 12 bytes holding sixteen
// 6-bit scales, d (fp16). Element 128h + 32s + l has its high bit in bit 4h + s of hmask[l];
// a clear high bit subtracts 4. Value (d * (scale - 32)) * q.
void dequantize_q3_k(const void* block, float* y) {
  const auto* b = static_cast<const unsigned char*>(block);
  const unsigned char* hmask = b;
  const unsigned char* qs = b + 32;
  const unsigned char* packed = b + 96;
  const float d = half(b + 108);
  // Scale i: low 4 bits from byte i % 8 (low nibble for i < 8, high for i >= 8), high 2 bits
  // from byte 8 + i % 4, bits 2 * (i / 4).
  int scale[16];
  for (int i = 0; i < 16; ++i) {
    const int lo = i < 8 ? packed[i] & 0x0f : packed[i - 8] >> 4;
    const int hi = (packed[8 + i % 4] >> (2 * (i / 4))) & 3;
    scale[i] = (lo | (hi << 4)) - 32;
  }
  for (int h = 0; h < 2; ++h)
    for (int s = 0; s < 4; ++s)
      for (int g = 0; g < 2; ++g) {  // 16 elements per scale
        const float dl = d * static_cast<float>(scale[8 * h + 2 * s + g]);
        for (int l = 16 * g; l < 16 * g + 16; ++l) {
          const int q = ((qs[32 * h + l] >> (2 * s)) & 3) - ((hmask[l] >> (4 * h + s)) & 1 ? 0 : 4);
          y[128 * h + 32 * s + l] = dl * static_cast<float>(q);
        }
      }
}

// The 6-bit scale and min of 32-element group j (< 8) of Q4_K / Q5_K from their 12 bytes.
void scale_min_k4(int j, const unsigned char* p, int& sc, int& m) {
  if (j < 4) {
    sc = p[j] & 63;
    m = p[j + 4] & 63;
  } else {
    sc = (p[j + 4] & 0x0f) | ((p[j - 4] >> 6) << 4);
    m = (p[j + 4] >> 4) | ((p[j] >> 6) << 4);
  }
}

// The factors of 64-element chunk c of Q4_K / Q5_K: groups 2c and 2c + 1's d * scale and
// dmin * min.
struct ChunkScales {
  float d0, n0, d1, n1;
};
ChunkScales chunk_scales(int c, const unsigned char* scales, float d, float dmin) {
  int sc0, m0, sc1, m1;
  scale_min_k4(2 * c, scales, sc0, m0);
  scale_min_k4(2 * c + 1, scales, sc1, m1);
  return {d * static_cast<float>(sc0), dmin * static_cast<float>(m0), d * static_cast<float>(sc1),
          dmin * static_cast<float>(m1)};
}

// Q4_K: d, dmin (fp16), 12 bytes of 6-bit scales and mins per 32 elements, 128 bytes of
// nibbles. Elements 64c + l (l < 32) are the low nibbles of bytes 32c + l (group 2c), elements
// 64c + 32 + l their high nibbles (group 2c + 1). Value (d * scale) * q - (dmin * min).
void dequantize_q4_k(const void* block, float* y) {
  const auto* b = static_cast<const unsigned char*>(block);
  const float d = half(b), dmin = half(b + 2);
  const unsigned char* scales = b + 4;
  const unsigned char* qs = b + 16;
  for (int c = 0; c < 4; ++c) {
    const ChunkScales k = chunk_scales(c, scales, d, dmin);
    for (int l = 0; l < 32; ++l) {
      y[64 * c + l] = k.d0 * static_cast<float>(qs[32 * c + l] & 0x0f) - k.n0;
      y[64 * c + 32 + l] = k.d1 * static_cast<float>(qs[32 * c + l] >> 4) - k.n1;
    }
  }
}

// Q5_K: Q4_K's fields, then 32 bytes of fifth bits (element 64c + l: bit 2c of qh[l]; element
// 64c + 32 + l: bit 2c + 1), then the nibbles. Value (d * scale) * q - (dmin * min).
void dequantize_q5_k(const void* block, float* y) {
  const auto* b = static_cast<const unsigned char*>(block);
  const float d = half(b), dmin = half(b + 2);
  const unsigned char* scales = b + 4;
  const unsigned char* qh = b + 16;
  const unsigned char* qs = b + 48;
  for (int c = 0; c < 4; ++c) {
    const ChunkScales k = chunk_scales(c, scales, d, dmin);
    for (int l = 0; l < 32; ++l) {
      const int lo = (qs[32 * c + l] & 0x0f) | (((qh[l] >> (2 * c)) & 1) << 4);
      const int hi = (qs[32 * c + l] >> 4) | (((qh[l] >> (2 * c + 1)) & 1) << 4);
      y[64 * c + l] = k.d0 * static_cast<float>(lo) - k.n0;
      y[64 * c + 32 + l] = k.d1 * static_cast<float>(hi) - k.n1;
    }
  }
}

// Q6_K: 128 bytes of low nibbles (ql), 64 bytes of 2-bit highs (qh), 16 int8 scales (one per
// 16 elements), d (fp16). In half h (128 elements), element 32r + l (r < 4, l < 32) takes the
// low (r < 2) or high (r >= 2) nibble of ql[64h + 32 (r & 1) + l] and bits 2r, 2r + 1 of
// qh[32h + l]; value (d * scale) * (q - 32).
void dequantize_q6_k(const void* block, float* y) {
  const auto* b = static_cast<const unsigned char*>(block);
  const unsigned char* ql = b;
  const unsigned char* qh = b + 128;
  const auto* scales = reinterpret_cast<const int8_t*>(b + 192);
  const float d = half(b + 208);
  for (int h = 0; h < 2; ++h)
    for (int r = 0; r < 4; ++r)
      for (int g = 0; g < 2; ++g) {  // 16 elements per scale
        const float ds = d * static_cast<float>(scales[8 * h + 2 * r + g]);
        for (int l = 16 * g; l < 16 * g + 16; ++l) {
          const unsigned char lq = ql[64 * h + 32 * (r & 1) + l];
          const int lo = r < 2 ? lq & 0x0f : lq >> 4;
          const int q = (lo | (((qh[32 * h + l] >> (2 * r)) & 3) << 4)) - 32;
          y[128 * h + 32 * r + l] = ds * static_cast<float>(q);
        }
      }
}

struct BlockFormat {
  GgmlType type;
  DequantizeBlockFn dequantize;
};

// Every quantized type flashdllm computes with: adding a type is adding a row here (its
// block size and bytes come from ggml_type_traits).
constexpr BlockFormat kBlockFormats[] = {
    {GgmlType::Q4_0, dequantize_q4_0}, {GgmlType::Q4_1, dequantize_q4_1}, {GgmlType::Q5_0, dequantize_q5_0},
    {GgmlType::Q5_1, dequantize_q5_1}, {GgmlType::Q8_0, dequantize_q8_0}, {GgmlType::Q2_K, dequantize_q2_k},
    {GgmlType::Q3_K, dequantize_q3_k}, {GgmlType::Q4_K, dequantize_q4_k}, {GgmlType::Q5_K, dequantize_q5_k},
    {GgmlType::Q6_K, dequantize_q6_k},
};

}  // namespace
}  // namespace fdl
