// Quantizers for the block formats of quant_block_formats.h (block_dequantizer's types): what
// `flashdllm tools make-model --dtype q4_k` and its siblings write. One function per type,
// each the inverse of that type's dequantizer: per block (or per group of a K-quant super
// block) a scale, and for the formats with a minimum an offset, from the values' range, then
// every value rounded to the nearest level. The scales are rounded to the stored precision
// (fp16 super-block factors, 4/6/8-bit group scales) before the values are quantized against
// them, so each value lands on the level nearest to it in the dequantized grid of its group.
// This is plain round-to-nearest, not llama.cpp's search for the scale with the least error:
// its error is somewhat larger, which suits random test weights.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "flashdllm/dtype.h"

namespace fdl {
namespace {

// fp16 as stored, and the float it reads back as.
float stored_half(float v, unsigned char* dst) {
  const uint16_t h = fp32_to_fp16(v);
  std::memcpy(dst, &h, 2);
  return fp16_to_fp32(h);
}

int clamp_round(float v, int lo, int hi) { return std::clamp(static_cast<int>(std::lrintf(v)), lo, hi); }

// The value of largest magnitude (its sign kept), for symmetric formats whose most negative
// level then holds it exactly.
float signed_absmax(const float* x, int n) {
  float best = 0.f;
  for (int i = 0; i < n; ++i)
    if (std::fabs(x[i]) > std::fabs(best)) best = x[i];
  return best;
}

// Symmetric n-element group on levels [lo, hi] around 0 (lo < 0): the factor the format stores
// before rounding, mapping the value of largest magnitude to lo.
float symmetric_scale(const float* x, int n, int lo) { return signed_absmax(x, n) / static_cast<float>(lo); }

// Level of v on a grid of step d (0: everything on level 0).
int level(float v, float d, int lo, int hi) { return d != 0.f ? clamp_round(v / d, lo, hi) : 0; }

// Asymmetric group: offset m >= 0 (the group's minimum, clamped to <= 0, negated) and step
// (max - min) / top, so that level q reads as step * q - m.
void range_scale(const float* x, int n, int top, float& step, float& m) {
  float lo = x[0], hi = x[0];
  for (int i = 1; i < n; ++i) lo = std::min(lo, x[i]), hi = std::max(hi, x[i]);
  lo = std::min(lo, 0.f);
  step = (hi - lo) / static_cast<float>(top);
  m = -lo;
}

// Q4_0: d (fp16), nibbles of q + 8 (element j: low nibble of byte j; j + 16: high nibble).
void quantize_q4_0(const float* x, unsigned char* b) {
  const float d = stored_half(symmetric_scale(x, 32, -8), b);
  for (int j = 0; j < 16; ++j)
    b[2 + j] = static_cast<unsigned char>((level(x[j], d, -8, 7) + 8) | ((level(x[j + 16], d, -8, 7) + 8) << 4));
}

// Q4_1: d, m (fp16), nibbles of q; value q * d + m.
void quantize_q4_1(const float* x, unsigned char* b) {
  float lo = x[0], hi = x[0];
  for (int i = 1; i < 32; ++i) lo = std::min(lo, x[i]), hi = std::max(hi, x[i]);
  const float d = stored_half((hi - lo) / 15.f, b), m = stored_half(lo, b + 2);
  for (int j = 0; j < 16; ++j)
    b[4 + j] = static_cast<unsigned char>(level(x[j] - m, d, 0, 15) | (level(x[j + 16] - m, d, 0, 15) << 4));
}

// The nibbles and fifth bits of 32 five-bit levels u (Q5_0 / Q5_1's layout).
void pack_q5(const int (&u)[32], unsigned char* qh, unsigned char* qs) {
  uint32_t bits = 0;
  for (int j = 0; j < 16; ++j) {
    qs[j] = static_cast<unsigned char>((u[j] & 15) | ((u[j + 16] & 15) << 4));
    bits |= static_cast<uint32_t>(u[j] >> 4) << j;
    bits |= static_cast<uint32_t>(u[j + 16] >> 4) << (j + 16);
  }
  std::memcpy(qh, &bits, 4);
}

// Q5_0: d (fp16), qh, nibbles; value (q - 16) * d.
void quantize_q5_0(const float* x, unsigned char* b) {
  const float d = stored_half(symmetric_scale(x, 32, -16), b);
  int u[32];
  for (int j = 0; j < 32; ++j) u[j] = level(x[j], d, -16, 15) + 16;
  pack_q5(u, b + 2, b + 6);
}

// Q5_1: d, m (fp16), qh, nibbles; value q * d + m.
void quantize_q5_1(const float* x, unsigned char* b) {
  float lo = x[0], hi = x[0];
  for (int i = 1; i < 32; ++i) lo = std::min(lo, x[i]), hi = std::max(hi, x[i]);
  const float d = stored_half((hi - lo) / 31.f, b), m = stored_half(lo, b + 2);
  int u[32];
  for (int j = 0; j < 32; ++j) u[j] = level(x[j] - m, d, 0, 31);
  pack_q5(u, b + 4, b + 8);
}

void quantize_q8_0(const float* x, unsigned char* b) {
  BlockQ8_0 q;
  quantize_row_q8_0(x, &q, 32);
  std::memcpy(b, &q, sizeof q);
}

// Where 16-element group i of a Q2_K / Q3_K / Q6_K super-block starts: group 8h + 2s + g holds
// elements 128h + 32s + 16g .. + 15 (its levels share bytes with the other groups of h).
int group16_start(int i) { return 128 * (i / 8) + 32 * ((i % 8) / 2) + 16 * (i % 2); }

// Q2_K: 16 groups of 16, each a 4-bit step and 4-bit offset against the fp16 d and dmin; 2-bit
// levels.
void quantize_q2_k(const float* x, unsigned char* b) {
  float step[16], off[16], max_step = 0.f, max_off = 0.f;
  for (int i = 0; i < 16; ++i) {
    range_scale(x + group16_start(i), 16, 3, step[i], off[i]);
    max_step = std::max(max_step, step[i]), max_off = std::max(max_off, off[i]);
  }
  unsigned char* scales = b;
  unsigned char* qs = b + 16;
  const float d = stored_half(max_step / 15.f, b + 80), dmin = stored_half(max_off / 15.f, b + 82);
  std::memset(qs, 0, 64);
  for (int i = 0; i < 16; ++i) {
    const int sc = level(step[i], d, 0, 15), mn = level(off[i], dmin, 0, 15);
    scales[i] = static_cast<unsigned char>(sc | (mn << 4));
    const float dl = d * static_cast<float>(sc), ml = dmin * static_cast<float>(mn);
    const int h = i / 8, s = (i % 8) / 2, g = i % 2;
    for (int l = 16 * g; l < 16 * g + 16; ++l) {
      const int q = level(x[128 * h + 32 * s + l] + ml, dl, 0, 3);
      qs[32 * h + l] = static_cast<unsigned char>(qs[32 * h + l] | (q << (2 * s)));
    }
  }
}

// Q3_K: 16 groups of 16 as Q2_K's, symmetric, each a signed 6-bit scale (stored + 32) against
// the fp16 d; 3-bit levels q in [-4, 3] as 2 low bits and a high bit (set: q >= 0).
void quantize_q3_k(const float* x, unsigned char* b) {
  float scale[16];
  for (int i = 0; i < 16; ++i) scale[i] = symmetric_scale(x + group16_start(i), 16, -4);
  unsigned char* hmask = b;
  unsigned char* qs = b + 32;
  unsigned char* packed = b + 96;
  const float d = stored_half(signed_absmax(scale, 16) / -32.f, b + 108);
  std::memset(b, 0, 108);
  for (int i = 0; i < 16; ++i) {
    const int sq = level(scale[i], d, -32, 31), u = sq + 32;
    packed[i % 8] = static_cast<unsigned char>(packed[i % 8] | ((u & 15) << (i < 8 ? 0 : 4)));
    packed[8 + i % 4] = static_cast<unsigned char>(packed[8 + i % 4] | ((u >> 4) << (2 * (i / 4))));
    const float dl = d * static_cast<float>(sq);
    const int h = i / 8, s = (i % 8) / 2, g = i % 2;
    for (int l = 16 * g; l < 16 * g + 16; ++l) {
      const int q = level(x[128 * h + 32 * s + l], dl, -4, 3) + 4;
      qs[32 * h + l] = static_cast<unsigned char>(qs[32 * h + l] | ((q & 3) << (2 * s)));
      hmask[l] = static_cast<unsigned char>(hmask[l] | ((q >> 2) << (4 * h + s)));
    }
  }
}

// Q4_K / Q5_K's 12 bytes of 6-bit scales and minimums of 8 groups (scale_min_k4's inverse).
void pack_scale_min_k4(const int (&sc)[8], const int (&mn)[8], unsigned char* p) {
  for (int j = 0; j < 4; ++j) {
    p[j] = static_cast<unsigned char>(sc[j] | ((sc[j + 4] >> 4) << 6));
    p[j + 4] = static_cast<unsigned char>(mn[j] | ((mn[j + 4] >> 4) << 6));
    p[j + 8] = static_cast<unsigned char>((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
  }
}

// Q4_K (top 15) and Q5_K (top 31): 8 groups of 32 (group 2c + k: elements 64c + 32k ..), each
// a 6-bit step and 6-bit offset against the fp16 d and dmin; levels 0..top into u.
void k4_levels(const float* x, int top, unsigned char* b, int (&u)[256]) {
  float step[8], off[8], max_step = 0.f, max_off = 0.f;
  for (int i = 0; i < 8; ++i) {
    range_scale(x + 32 * i, 32, top, step[i], off[i]);
    max_step = std::max(max_step, step[i]), max_off = std::max(max_off, off[i]);
  }
  const float d = stored_half(max_step / 63.f, b), dmin = stored_half(max_off / 63.f, b + 2);
  int sc[8], mn[8];
  for (int i = 0; i < 8; ++i) {
    sc[i] = level(step[i], d, 0, 63), mn[i] = level(off[i], dmin, 0, 63);
    const float dl = d * static_cast<float>(sc[i]), ml = dmin * static_cast<float>(mn[i]);
    for (int l = 0; l < 32; ++l) u[32 * i + l] = level(x[32 * i + l] + ml, dl, 0, top);
  }
  pack_scale_min_k4(sc, mn, b + 4);
}

void quantize_q4_k(const float* x, unsigned char* b) {
  int u[256];
  k4_levels(x, 15, b, u);
  unsigned char* qs = b + 16;
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l)
      qs[32 * c + l] = static_cast<unsigned char>(u[64 * c + l] | (u[64 * c + 32 + l] << 4));
}

void quantize_q5_k(const float* x, unsigned char* b) {
  int u[256];
  k4_levels(x, 31, b, u);
  unsigned char* qh = b + 16;
  unsigned char* qs = b + 48;
  std::memset(qh, 0, 32);
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l) {
      const int lo = u[64 * c + l], hi = u[64 * c + 32 + l];
      qs[32 * c + l] = static_cast<unsigned char>((lo & 15) | ((hi & 15) << 4));
      qh[l] = static_cast<unsigned char>(qh[l] | ((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1)));
    }
}

// Q6_K: 16 groups of 16 as Q2_K's, each an int8 scale against the fp16 d; 6-bit levels q in
// [-32, 31] stored as q + 32.
void quantize_q6_k(const float* x, unsigned char* b) {
  float scale[16];
  for (int i = 0; i < 16; ++i) scale[i] = symmetric_scale(x + group16_start(i), 16, -32);
  unsigned char* ql = b;
  unsigned char* qh = b + 128;
  auto* scales = reinterpret_cast<int8_t*>(b + 192);
  const float d = stored_half(signed_absmax(scale, 16) / -128.f, b + 208);
  std::memset(b, 0, 192);
  for (int i = 0; i < 16; ++i) {
    const int sq = level(scale[i], d, -128, 127);
    scales[i] = static_cast<int8_t>(sq);
    const float dl = d * static_cast<float>(sq);
    const int h = i / 8, r = (i % 8) / 2, g = i % 2;
    for (int l = 16 * g; l < 16 * g + 16; ++l) {
      const int u = level(x[128 * h + 32 * r + l], dl, -32, 31) + 32;
      unsigned char& lq = ql[64 * h + 32 * (r & 1) + l];
      lq = static_cast<unsigned char>(lq | ((u & 15) << (r < 2 ? 0 : 4)));
      qh[32 * h + l] = static_cast<unsigned char>(qh[32 * h + l] | ((u >> 4) << (2 * r)));
    }
  }
}

using QuantizeBlockFn = void (*)(const float* x, unsigned char* block);

struct BlockQuantizer {
  GgmlType type;
  QuantizeBlockFn quantize;
};

// One row per type block_dequantizer() reads.
constexpr BlockQuantizer kQuantizers[] = {
    {GgmlType::Q4_0, quantize_q4_0}, {GgmlType::Q4_1, quantize_q4_1}, {GgmlType::Q5_0, quantize_q5_0},
    {GgmlType::Q5_1, quantize_q5_1}, {GgmlType::Q8_0, quantize_q8_0}, {GgmlType::Q2_K, quantize_q2_k},
    {GgmlType::Q3_K, quantize_q3_k}, {GgmlType::Q4_K, quantize_q4_k}, {GgmlType::Q5_K, quantize_q5_k},
    {GgmlType::Q6_K, quantize_q6_k},
};

QuantizeBlockFn quantizer_of(GgmlType t) {
  for (const BlockQuantizer& q : kQuantizers)
    if (q.type == t) return q.quantize;
  return nullptr;
}

}  // namespace

bool has_quantizer(GgmlType t) { return quantizer_of(t) != nullptr; }

void quantize_row(GgmlType t, const float* src, void* dst, size_t n) {
  const QuantizeBlockFn quantize = quantizer_of(t);
  if (quantize == nullptr)
    throw std::invalid_argument("quantize_row: no quantizer for " + ggml_type_name(static_cast<uint32_t>(t)));
  const GgmlTypeTraits tr = *ggml_type_traits(static_cast<uint32_t>(t));
  if (n % tr.block_size != 0)
    throw std::invalid_argument("quantize_row: " + std::string(tr.name) + " row length " + std::to_string(n) +
                                " is not a multiple of " + std::to_string(tr.block_size));
  auto* out = static_cast<unsigned char*>(dst);
  for (size_t i = 0; i < n / tr.block_size; ++i) quantize(src + i * tr.block_size, out + i * tr.type_size);
}

}  // namespace fdl
