// The Q8_K activation rows and the plain-C++ form of the K-quant integer dot products
// (q8k.h): the quantizer runs on every ISA; the reference sums are what q8k_avx2.cpp computes.
#include "backend/cpu/q8k.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "flashdllm/dtype.h"

namespace fdl::cpu::detail {
namespace {

// Level of element e of a Q4_K / Q5_K block (qh: Q5_K's fifth bits, else null).
int k4_level(const unsigned char* qs, const unsigned char* qh, int e) {
  const int c = e / 64, l = e % 32, hi = (e % 64) / 32;
  int u = hi ? qs[32 * c + l] >> 4 : qs[32 * c + l] & 0x0f;
  if (qh != nullptr) u |= ((qh[l] >> (2 * c + hi)) & 1) << 4;
  return u;
}

}  // namespace

void quantize_rows_q8k(const float* x, int64_t n_tokens, int64_t cols, BlockQ8K* out) {
  const int64_t nb = cols / 256;
  for (int64_t b = 0; b < n_tokens * nb; ++b) {
    const float* v = x + b * 256;
    float amax = 0.f;
    bool finite = true;
    for (int i = 0; i < 256; ++i) amax = std::max(amax, std::fabs(v[i])), finite = finite && std::isfinite(v[i]);
    BlockQ8K& q = out[b];
    if (!finite) {  // a NaN or infinite activation must not give finite outputs: NaN scale
      q = BlockQ8K{};
      q.d = std::numeric_limits<float>::quiet_NaN();
      continue;
    }
    q.d = amax / 127.f;
    // A block so small that 127 / amax overflows (below about 4e-37) rounds to zeros, as a block
    // of zeros does; an infinite factor would make 0 * inf = NaN.
    const float id = amax > 0.f && std::isfinite(127.f / amax) ? 127.f / amax : 0.f;
    // Ties to even (the rounding mode's default), as the AVX2 conversion rounds.
    for (int i = 0; i < 256; ++i) q.qs[i] = static_cast<int8_t>(std::clamp(std::nearbyint(v[i] * id), -127.f, 127.f));
    for (int j = 0; j < 16; ++j) {
      int s = 0;
      for (int i = 0; i < 16; ++i) s += q.qs[16 * j + i];
      q.bsums[j] = static_cast<int16_t>(s);
    }
  }
}

float q8k_dot_reference(GgmlType t, const unsigned char* w_row, const BlockQ8K* x_row, int64_t n_blocks) {
  const size_t block_bytes = ggml_type_traits(static_cast<uint32_t>(t))->type_size;
  float lane[8] = {};
  for (int64_t b = 0; b < n_blocks; ++b) {
    const unsigned char* w = w_row + b * block_bytes;
    const BlockQ8K& x = x_row[b];
    int acc[8] = {};  // lane j: elements i with (i % 32) / 4 == j, each times its group's scale
    if (t == GgmlType::Q6_K) {
      const unsigned char* ql = w;
      const unsigned char* qh = w + 128;
      const auto* scales = reinterpret_cast<const int8_t*>(w + 192);
      for (int i = 0; i < 256; ++i) {
        const int h = i / 128, r = (i % 128) / 32, l = i % 32;
        const unsigned char lq = ql[64 * h + 32 * (r & 1) + l];
        const int u = (r < 2 ? lq & 0x0f : lq >> 4) | (((qh[32 * h + l] >> (2 * r)) & 3) << 4);
        acc[l / 4] += scales[i / 16] * u * x.qs[i];
      }
      const float dq = half_at(w + 208) * x.d;
      for (int j = 0; j < 8; ++j) {
        const int offset = scales[2 * j] * x.bsums[2 * j] + scales[2 * j + 1] * x.bsums[2 * j + 1];
        lane[j] += dq * static_cast<float>(acc[j] - 32 * offset);
      }
      continue;
    }
    const bool q5 = t == GgmlType::Q5_K;
    const unsigned char* qh = q5 ? w + 16 : nullptr;
    const unsigned char* qs = w + (q5 ? 48 : 16);
    int sc[8], m[8];
    k4_scales(w + 4, sc, m);
    for (int i = 0; i < 256; ++i) acc[(i % 32) / 4] += sc[i / 32] * k4_level(qs, qh, i) * x.qs[i];
    const float dd = half_at(w) * x.d, dm = half_at(w + 2) * x.d;
    for (int j = 0; j < 8; ++j) {
      const int msum = m[j] * (x.bsums[2 * j] + x.bsums[2 * j + 1]);
      lane[j] += dd * static_cast<float>(acc[j]) - dm * static_cast<float>(msum);
    }
  }
  return combine_lanes(lane);
}

}  // namespace fdl::cpu::detail
