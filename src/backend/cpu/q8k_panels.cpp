// The panel layout of q8k_panels.h in plain C++: rearranging a matrix in place both ways, the
// activations' panel blocks, and the reference dot product the VNNI kernels are held to.
#include "backend/cpu/q8k_panels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace fdl::cpu::detail {
namespace {

// Where a format keeps its fields, in a GGUF block and in a panel block.
struct PanelFormat {
  int block_bytes;  // GGUF block
  int masks;        // 64-bit masks per step in the panel (0, 2 or 4)
  int scales_at;    // panel block offset of the scales
  int d_at;         // panel block offset of the 16 d (dmin follow for Q4_K / Q5_K)
};

PanelFormat format_of(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_K: return {144, 0, 2048, 2048 + 192};
    case GgmlType::Q5_K: return {176, 2, 2560, 2560 + 192};
    case GgmlType::Q6_K: return {210, 4, 3072, 3072 + 256};
    case GgmlType::Q8_0: return {8 * 34, 0, 0, 4096};  // a "block": 256 columns, eight Q8_0 blocks
    default: throw std::invalid_argument("q8k panels: " + ggml_type_name(static_cast<uint32_t>(t)) + " has no panel layout");
  }
}

// Sets element k's level u in a GGUF block (the inverse of gguf_levels below).
void set_gguf_level(GgmlType t, uint8_t* blk, int k, int u) {
  if (t == GgmlType::Q6_K) {
    const int h = k / 128, q = (k % 128) / 32, l = k % 32;
    uint8_t& lq = blk[64 * h + 32 * (q & 1) + l];
    lq = q < 2 ? uint8_t((lq & 0xf0) | (u & 15)) : uint8_t((lq & 0x0f) | ((u & 15) << 4));
    uint8_t& hq = blk[128 + 32 * h + l];
    hq = uint8_t((hq & ~(3 << (2 * q))) | (((u >> 4) & 3) << (2 * q)));
    return;
  }
  const bool q5 = t == GgmlType::Q5_K;
  uint8_t* qs = blk + (q5 ? 48 : 16);
  const int c = k / 64, l = k % 32, hi = (k % 64) / 32;
  uint8_t& b = qs[32 * c + l];
  b = hi ? uint8_t((b & 0x0f) | ((u & 15) << 4)) : uint8_t((b & 0xf0) | (u & 15));
  if (q5) {
    const int bit = 2 * c + hi;
    blk[16 + l] = uint8_t((blk[16 + l] & ~(1 << bit)) | (((u >> 4) & 1) << bit));
  }
}

// Byte offset in a panel block of step s's mask for half h (elements 8s + 4h ..) and high bit b.
int mask_at(const PanelFormat& f, int s, int h, int b) { return 2048 + 8 * (f.masks * s + (f.masks / 2) * h + b); }

// The panel's level of element k of row r.
int panel_level(const PanelFormat& f, const uint8_t* pb, int r, int k) {
  const int s = k / 8, h = (k % 8) / 4, j = k % 4;
  const uint8_t nib = pb[64 * s + 4 * r + j];
  int u = h ? nib >> 4 : nib & 15;
  for (int b = 0; b < f.masks / 2; ++b) {
    uint64_t m;
    std::memcpy(&m, pb + mask_at(f, s, h, b), 8);
    u |= int((m >> (4 * r + j)) & 1) << (4 + b);
  }
  return u;
}

// The bytes of a GGUF block other than its levels: Q4_K / Q5_K: d, dmin, 12 scale bytes
// (offsets 0, 2, 4); Q6_K: 16 int8 scales at 192, d at 208.
void panel_fields_from_gguf(GgmlType t, const PanelFormat& f, const uint8_t* blk, int r, uint8_t* pb) {
  if (t == GgmlType::Q6_K) {
    for (int g = 0; g < 16; ++g) pb[f.scales_at + 16 * g + r] = blk[192 + g];
    std::memcpy(pb + f.d_at + 2 * r, blk + 208, 2);
    return;
  }
  for (int w = 0; w < 3; ++w) std::memcpy(pb + f.scales_at + 64 * w + 4 * r, blk + 4 + 4 * w, 4);
  std::memcpy(pb + f.d_at + 2 * r, blk, 2);
  std::memcpy(pb + f.d_at + 32 + 2 * r, blk + 2, 2);
}

void gguf_fields_from_panel(GgmlType t, const PanelFormat& f, const uint8_t* pb, int r, uint8_t* blk) {
  if (t == GgmlType::Q6_K) {
    for (int g = 0; g < 16; ++g) blk[192 + g] = pb[f.scales_at + 16 * g + r];
    std::memcpy(blk + 208, pb + f.d_at + 2 * r, 2);
    return;
  }
  for (int w = 0; w < 3; ++w) std::memcpy(blk + 4 + 4 * w, pb + f.scales_at + 64 * w + 4 * r, 4);
  std::memcpy(blk, pb + f.d_at + 2 * r, 2);
  std::memcpy(blk + 2, pb + f.d_at + 32 + 2 * r, 2);
}

// The 256 levels of a GGUF block (gguf_level's, without a branch per element).
void gguf_levels(GgmlType t, const uint8_t* blk, uint8_t (&u)[256]) {
  if (t == GgmlType::Q6_K) {
    const uint8_t* ql = blk;
    const uint8_t* qh = blk + 128;
    for (int h = 0; h < 2; ++h)
      for (int l = 0; l < 32; ++l) {
        const uint8_t a = ql[64 * h + l], b = ql[64 * h + 32 + l], hb = qh[32 * h + l];
        u[128 * h + l] = uint8_t((a & 15) | ((hb & 3) << 4));
        u[128 * h + 32 + l] = uint8_t((b & 15) | (((hb >> 2) & 3) << 4));
        u[128 * h + 64 + l] = uint8_t((a >> 4) | (((hb >> 4) & 3) << 4));
        u[128 * h + 96 + l] = uint8_t((b >> 4) | (((hb >> 6) & 3) << 4));
      }
    return;
  }
  const bool q5 = t == GgmlType::Q5_K;
  const uint8_t* qs = blk + (q5 ? 48 : 16);
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l) {
      const uint8_t q = qs[32 * c + l];
      const int h = q5 ? blk[16 + l] >> (2 * c) : 0;
      u[64 * c + l] = uint8_t((q & 15) | ((h & 1) << 4));
      u[64 * c + 32 + l] = uint8_t((q >> 4) | (((h >> 1) & 1) << 4));
    }
}

// Bit 0 of each byte of v, gathered into bits 0-3 (byte i to bit i): one multiply places the
// four bits side by side in the top byte, with no carries between the partial products.
uint64_t four_bits(uint32_t v) { return (((v & 0x01010101u) * 0x01020408u) >> 24) & 15u; }

// Q8_0: the 16 rows' eight blocks of 256 columns (row r's at rows + r * row_bytes), or back.
void write_q80_panel_block(const uint8_t* rows, size_t row_bytes, uint8_t* pb) {
  for (int r = 0; r < 16; ++r)
    for (int g = 0; g < 8; ++g) {
      const uint8_t* blk = rows + size_t(r) * row_bytes + 34 * g;
      std::memcpy(pb + 4096 + 32 * g + 2 * r, blk, 2);
      for (int s = 0; s < 16; ++s) std::memcpy(pb + 512 * g + 32 * s + 2 * r, blk + 2 + 2 * s, 2);
    }
}
void read_q80_panel_block(const uint8_t* pb, uint8_t* rows, size_t row_bytes) {
  for (int r = 0; r < 16; ++r)
    for (int g = 0; g < 8; ++g) {
      uint8_t* blk = rows + size_t(r) * row_bytes + 34 * g;
      std::memcpy(blk, pb + 4096 + 32 * g + 2 * r, 2);
      for (int s = 0; s < 16; ++s) std::memcpy(blk + 2 + 2 * s, pb + 512 * g + 32 * s + 2 * r, 2);
    }
}

// One panel block from the 16 rows' GGUF blocks (row r's at rows + r * row_bytes), a step's 4
// levels at a time.
void write_panel_block(GgmlType t, const PanelFormat& f, const uint8_t* rows, size_t row_bytes, uint8_t* pb) {
  if (t == GgmlType::Q8_0) return write_q80_panel_block(rows, row_bytes, pb);
  uint64_t masks[32][4] = {};  // [step][half * (masks / 2) + bit]
  for (int r = 0; r < 16; ++r) {
    const uint8_t* blk = rows + size_t(r) * row_bytes;
    uint8_t u[256];
    gguf_levels(t, blk, u);
    for (int s = 0; s < 32; ++s) {
      uint32_t lo, hi;  // elements 8s .. 8s + 3 and 8s + 4 .. 8s + 7 (little-endian bytes)
      std::memcpy(&lo, u + 8 * s, 4);
      std::memcpy(&hi, u + 8 * s + 4, 4);
      const uint32_t nib = (lo & 0x0f0f0f0fu) | ((hi & 0x0f0f0f0fu) << 4);
      std::memcpy(pb + 64 * s + 4 * r, &nib, 4);
      for (int b = 0; b < f.masks / 2; ++b) {
        masks[s][b] |= four_bits(lo >> (4 + b)) << (4 * r);
        masks[s][f.masks / 2 + b] |= four_bits(hi >> (4 + b)) << (4 * r);
      }
    }
    panel_fields_from_gguf(t, f, blk, r, pb);
  }
  for (int s = 0; s < 32; ++s)
    for (int h = 0; h < 2; ++h)
      for (int b = 0; b < f.masks / 2; ++b) std::memcpy(pb + mask_at(f, s, h, b), &masks[s][(f.masks / 2) * h + b], 8);
}

void read_panel_block(GgmlType t, const PanelFormat& f, const uint8_t* pb, uint8_t* rows, size_t row_bytes) {
  if (t == GgmlType::Q8_0) return read_q80_panel_block(pb, rows, row_bytes);
  for (int r = 0; r < 16; ++r) {
    uint8_t* blk = rows + size_t(r) * row_bytes;
    std::memset(blk, 0, size_t(f.block_bytes));
    for (int k = 0; k < 256; ++k) set_gguf_level(t, blk, k, panel_level(f, pb, r, k));
    gguf_fields_from_panel(t, f, pb, r, blk);
  }
}

void check_shape(GgmlType type, int64_t rows, int64_t cols) {
  if (!panels_fit(WeightMatrix{type, nullptr, rows, cols}))
    throw std::invalid_argument("q8k panels: a " + ggml_type_name(static_cast<uint32_t>(type)) + " matrix of " +
                                std::to_string(rows) + " x " + std::to_string(cols) +
                                " has no panel layout (Q4_K, Q5_K, Q6_K or Q8_0, rows a multiple of 16, columns of 256)");
}

// Rewrites each panel of the matrix through a copy of its bytes.
template <typename F>
void each_panel(GgmlType type, uint8_t* data, int64_t rows, int64_t cols, F&& rewrite) {
  check_shape(type, rows, cols);
  const PanelFormat f = format_of(type);
  const int64_t nb = cols / 256;
  const size_t row_bytes = size_t(nb) * size_t(f.block_bytes), panel_bytes = 16 * row_bytes;
  std::vector<uint8_t> copy(panel_bytes);
  for (int64_t p = 0; p < rows / kPanelRows; ++p) {
    uint8_t* panel = data + size_t(p) * panel_bytes;
    std::memcpy(copy.data(), panel, panel_bytes);
    for (int64_t b = 0; b < nb; ++b) rewrite(f, copy.data(), panel, b, row_bytes);
  }
}

}  // namespace

bool panel_type(GgmlType t) {
  return t == GgmlType::Q4_K || t == GgmlType::Q5_K || t == GgmlType::Q6_K || t == GgmlType::Q8_0;
}

bool panels_fit(const WeightMatrix& W) {
  return !W.panels && panel_type(W.type) && W.rows > 0 && W.rows % kPanelRows == 0 && W.cols > 0 && W.cols % 256 == 0;
}

}  // namespace fdl::cpu::detail

namespace fdl::cpu::detail {

void check_panel_rows(const char* kernel, int64_t rows, int64_t row_begin, int64_t row_end) {
  if (rows % kPanelRows != 0 || row_begin < 0 || row_begin % kPanelRows != 0 || row_end % kPanelRows != 0 ||
      row_end < row_begin || row_end > rows)
    throw std::invalid_argument(std::string(kernel) + ": rows [" + std::to_string(row_begin) + ", " +
                                std::to_string(row_end) + ") are not whole panels of 16 of a matrix of " +
                                std::to_string(rows) + " rows");
}

void to_panels(GgmlType type, uint8_t* data, int64_t rows, int64_t cols) {
  each_panel(type, data, rows, cols, [type](const PanelFormat& f, const uint8_t* src, uint8_t* panel, int64_t b, size_t row_bytes) {
    write_panel_block(type, f, src + size_t(b) * size_t(f.block_bytes), row_bytes, panel + size_t(b) * 16 * size_t(f.block_bytes));
  });
}

void from_panels(GgmlType type, uint8_t* data, int64_t rows, int64_t cols) {
  each_panel(type, data, rows, cols, [type](const PanelFormat& f, const uint8_t* src, uint8_t* panel, int64_t b, size_t row_bytes) {
    read_panel_block(type, f, src + size_t(b) * 16 * size_t(f.block_bytes), panel + size_t(b) * size_t(f.block_bytes), row_bytes);
  });
}

void to_panel_activations(const BlockQ8K* rows, int64_t n_tokens, int64_t nb, Q8Panel* out) {
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int64_t b = 0; b < nb; ++b) {
      const BlockQ8K& x = rows[t * nb + b];
      Q8Panel& p = out[b * n_tokens + t];
      std::memcpy(p.qs, x.qs, 256);
      p.d = x.d;
      for (int j = 0; j < 4; ++j) {
        const int lo = x.bsums[4 * j] + x.bsums[4 * j + 1], hi = x.bsums[4 * j + 2] + x.bsums[4 * j + 3];
        p.min_pairs[j] = int32_t(uint32_t(uint16_t(int16_t(lo))) | (uint32_t(uint16_t(int16_t(hi))) << 16));
      }
      for (int g = 0; g < 16; ++g) p.offsets[g] = 32 * x.bsums[g];
    }
}

float q8k_panel_dot_reference(GgmlType type, const uint8_t* panel, int64_t nb, int r, const BlockQ8K* x_row) {
  const PanelFormat f = format_of(type);
  float acc = 0.f;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* pb = panel + size_t(b) * 16 * size_t(f.block_bytes);
    const BlockQ8K& x = x_row[b];
    uint8_t blk[256];  // the row's GGUF fields, for their scales and d
    gguf_fields_from_panel(type, f, pb, r, blk);
    if (type == GgmlType::Q6_K) {
      const auto* sc = reinterpret_cast<const int8_t*>(blk + 192);
      int32_t S = 0;
      for (int g = 0; g < 16; ++g) {
        int32_t isum = 0;
        for (int k = 16 * g; k < 16 * g + 16; ++k) isum += (panel_level(f, pb, r, k) - 32) * x.qs[k];
        S += sc[g] * isum;
      }
      acc = acc + (half_at(blk + 208) * x.d) * static_cast<float>(S);
      continue;
    }
    int sc[8], m[8];
    k4_scales(blk + 4, sc, m);
    int32_t S = 0, M = 0;
    for (int g = 0; g < 8; ++g) {
      int32_t isum = 0, xsum = 0;
      for (int k = 32 * g; k < 32 * g + 32; ++k) isum += panel_level(f, pb, r, k) * x.qs[k], xsum += x.qs[k];
      S += sc[g] * isum;
      M += m[g] * xsum;
    }
    const float dd = half_at(blk) * x.d, dm = half_at(blk + 2) * x.d;
    acc = acc + (dd * static_cast<float>(S) - dm * static_cast<float>(M));
  }
  return acc;
}

}  // namespace fdl::cpu::detail

namespace fdl::cpu::detail {

void quantize_rows_q16(const float* x, int64_t n_tokens, int64_t cols, Q16Panel* out) {
  const int64_t nb = cols / 256;
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int64_t b = 0; b < nb; ++b) {
      const float* v = x + t * cols + b * 256;
      Q16Panel& q = out[b * n_tokens + t];
      float amax = 0.f;
      bool finite = true;
      for (int i = 0; i < 256; ++i) amax = std::max(amax, std::fabs(v[i])), finite = finite && std::isfinite(v[i]);
      if (!finite) {  // NaN or infinite activations give NaN outputs
        q = Q16Panel{};
        q.d = std::numeric_limits<float>::quiet_NaN();
        continue;
      }
      q.d = amax / 32767.f;
      // A block this small (32767 / amax overflowing) rounds to zeros, as a block of zeros.
      const float id = amax > 0.f && std::isfinite(32767.f / amax) ? 32767.f / amax : 0.f;
      for (int i = 0; i < 256; ++i) q.qs[i] = static_cast<int16_t>(std::clamp(std::nearbyint(v[i] * id), -32767.f, 32767.f));
    }
}

float q80_panel_dot_reference(const uint8_t* panel, int64_t nb, int r, const Q16Panel* x, int64_t ld) {
  float acc = 0.f;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* pb = panel + size_t(b) * 4352;
    const Q16Panel& xb = x[b * ld];
    for (int g = 0; g < 8; ++g) {
      int32_t isum = 0;
      for (int k = 0; k < 32; ++k) isum += int8_t(pb[512 * g + 32 * (k / 2) + 2 * r + k % 2]) * xb.qs[32 * g + k];
      acc = std::fma(half_at(pb + 4096 + 32 * g + 2 * r) * xb.d, static_cast<float>(isum), acc);
    }
  }
  return acc;
}

}  // namespace fdl::cpu::detail
