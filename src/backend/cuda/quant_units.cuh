// quant_units.cuh — the block-quantized device rows (kernels.h: QType) read 32 values at a
// time. A "unit" is 32 weights of one row as two halves of 16 consecutive values, each half
// inside one 32-value group of the row (the activations' Q8 group), with its 6-bit or 8-bit
// integers and the factors that turn them into the format's values:
//   value = da * (q - bias) - ma        (Q4_K, Q5_K: bias 0, ma = dmin * min;
//                                         Q6_K: bias 32, ma 0; Q8_0: signed q, bias 0, ma 0)
// the formulas of the CPU dequantizers (src/core/quant_block_formats.h), so a value computed
// from a unit in fp32 without contraction is the CPU's bit for bit.
// Units are numbered along the row (cols / 32 of them); unit u of a K-quant row lies in
// super-block u / 8. Loads are 16-byte vectors: each format's load() issues them all before
// unit() uses any, so a warp can keep several units of loads in flight.
// Device code only; include from .cu files.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/kernels.h"

namespace fdl::cuda::quant {

/// 32 weights as two halves (a: values pos_a .. pos_a + 15, b likewise); qa / qb hold one
/// integer per byte (unsigned 0..63, or signed for Q8_0), 16 each.
struct Unit {
  uint4 qa, qb;
  int ga, gb;      ///< the 32-value groups of the halves
  int oa, ob;      ///< their offsets in the group (0 or 16)
  float da, db;    ///< scales
  float ma, mb;    ///< offsets (dmin * min), or 0
  int bias;        ///< subtracted from every q (32 for Q6_K), or 0
  bool is_signed;  ///< q bytes are int8 (Q8_0)
};

__device__ __forceinline__ float half_bits(unsigned h) { return __half2float(__ushort_as_half(uint16_t(h & 0xffffu))); }
__device__ __forceinline__ uint4 ld16(const uint8_t* p) { return __ldcs(reinterpret_cast<const uint4*>(p)); }
__device__ __forceinline__ unsigned byte_of(const uint4& v, int i) {
  const unsigned w = i < 4 ? v.x : i < 8 ? v.y : i < 12 ? v.z : v.w;
  return (w >> (8 * (i & 3))) & 0xffu;
}

/// Q4_K: 144-byte super-blocks: d, dmin (fp16), 12 bytes of scales and mins, 128 bytes of
/// nibbles. Unit j (< 8) of a super-block: chunk c = j / 2, half h = j % 2: bytes 32c + 16h ..
/// + 15 of the nibbles, whose low nibbles are values 64c + 16h + i (group 2c) and high nibbles
/// values 64c + 32 + 16h + i (group 2c + 1).
struct Q4K {
  __device__ static int64_t row_bytes(int cols) { return quant_row_bytes(QType::Q4_K, cols); }
  struct Raw {
    uint4 head, q;
  };
  __device__ static void load(const uint8_t* row, int u, int /*cols*/, Raw& r) {
    const uint8_t* blk = row + size_t(u >> 3) * 144;
    const int j = u & 7;
    r.head = __ldg(reinterpret_cast<const uint4*>(blk));  // shared by the super-block's 8 units
    r.q = ld16(blk + 16 + 32 * (j >> 1) + 16 * (j & 1));
  }
  __device__ static void unit(const Raw& r, int u, Unit& w) {
    const int j = u & 7, c = j >> 1, h = j & 1;
    constexpr unsigned kLow = 0x0f0f0f0fu;
    w.qa = make_uint4(r.q.x & kLow, r.q.y & kLow, r.q.z & kLow, r.q.w & kLow);
    w.qb = make_uint4((r.q.x >> 4) & kLow, (r.q.y >> 4) & kLow, (r.q.z >> 4) & kLow, (r.q.w >> 4) & kLow);
    finish(r.head, u, c, h, w);
  }
  // The 6-bit scales and mins of all 8 groups at once, 4 per word (ggml's packing: groups
  // 0-3 in the low 6 bits of bytes 0-3 / 4-7, groups 4-7 in the nibbles of bytes 8-11 with
  // their top 2 bits in the top bits of bytes 0-3 / 4-7), then the two of chunk c.
  __device__ static void finish(const uint4& head, int u, int c, int h, Unit& w) {
    const float d = half_bits(head.x), dmin = half_bits(head.x >> 16);
    const unsigned w0 = head.y, w1 = head.z, w2 = head.w;
    const unsigned sc = c < 2 ? (w0 & 0x3f3f3f3fu) : ((w2 & 0x0f0f0f0fu) | ((w0 >> 2) & 0x30303030u));
    const unsigned mn = c < 2 ? (w1 & 0x3f3f3f3fu) : (((w2 >> 4) & 0x0f0f0f0fu) | ((w1 >> 2) & 0x30303030u));
    const unsigned shift = unsigned(16 * (c & 1));  // groups 2c, 2c + 1 are bytes 2(c % 2), + 1
    const int sc0 = int((sc >> shift) & 0xffu), sc1 = int((sc >> (shift + 8)) & 0xffu);
    const int m0 = int((mn >> shift) & 0xffu), m1 = int((mn >> (shift + 8)) & 0xffu);
    const int g = (u >> 3) * 8 + 2 * c;
    w.ga = g, w.gb = g + 1, w.oa = w.ob = 16 * h;
    w.da = __fmul_rn(d, float(sc0)), w.ma = __fmul_rn(dmin, float(m0));
    w.db = __fmul_rn(d, float(sc1)), w.mb = __fmul_rn(dmin, float(m1));
    w.bias = 0, w.is_signed = false;
  }
};

/// Q5_K: 176-byte super-blocks: Q4_K's 16-byte head, 32 bytes of fifth bits (value 64c + l:
/// bit 2c of byte l; value 64c + 32 + l: bit 2c + 1), then the nibbles as Q4_K's.
struct Q5K {
  __device__ static int64_t row_bytes(int cols) { return quant_row_bytes(QType::Q5_K, cols); }
  struct Raw {
    uint4 head, qh, q;
  };
  __device__ static void load(const uint8_t* row, int u, int /*cols*/, Raw& r) {
    const uint8_t* blk = row + size_t(u >> 3) * 176;
    const int j = u & 7, c = j >> 1, h = j & 1;
    r.head = __ldg(reinterpret_cast<const uint4*>(blk));
    r.qh = __ldg(reinterpret_cast<const uint4*>(blk + 16 + 16 * h));  // shared by the 4 chunks
    r.q = ld16(blk + 48 + 32 * c + 16 * h);
  }
  __device__ static void unit(const Raw& r, int u, Unit& w) {
    const int j = u & 7, c = j >> 1, h = j & 1;
    const unsigned lo_shift = unsigned(2 * c), hi_shift = unsigned(2 * c + 1);
    auto lo = [&](unsigned q, unsigned qh) { return (q & 0x0f0f0f0fu) | (((qh >> lo_shift) & 0x01010101u) << 4); };
    auto hi = [&](unsigned q, unsigned qh) { return ((q >> 4) & 0x0f0f0f0fu) | (((qh >> hi_shift) & 0x01010101u) << 4); };
    w.qa = make_uint4(lo(r.q.x, r.qh.x), lo(r.q.y, r.qh.y), lo(r.q.z, r.qh.z), lo(r.q.w, r.qh.w));
    w.qb = make_uint4(hi(r.q.x, r.qh.x), hi(r.q.y, r.qh.y), hi(r.q.z, r.qh.z), hi(r.q.w, r.qh.w));
    Q4K::finish(r.head, u, c, h, w);
  }
};

/// Q6_K, planar rows (kernels.h: QType): ql [nb][128], qh [nb][64], scales [nb][16] (int8),
/// d [nb] (fp16). In half h (128 values) of a super-block, value 32r + l (r < 4, l < 32) takes
/// the low (r < 2) or high nibble of ql[64h + 32(r & 1) + l] and bits 2r, 2r + 1 of
/// qh[32h + l]; scale 8h + 2r + l / 16. Unit j (< 8): h = j / 4, p = (j / 2) % 2, k = j % 2:
/// ql bytes 64h + 32p + 16k .. + 15 give values 32p + 16k + i (r = p, low nibbles) and
/// 32(p + 2) + 16k + i (r = p + 2, high nibbles) of half h.
struct Q6K {
  __device__ static int64_t row_bytes(int cols) { return quant_row_bytes(QType::Q6_K, cols); }
  struct Raw {
    uint4 ql, qh;
    int8_t sa, sb;
    unsigned d;
  };
  __device__ static void load(const uint8_t* row, int u, int cols, Raw& r) {
    const int nb = cols / 256, b = u >> 3, j = u & 7, h = j >> 2, p = (j >> 1) & 1, k = j & 1;
    r.ql = ld16(row + size_t(b) * 128 + 64 * h + 32 * p + 16 * k);
    r.qh = ld16(row + size_t(nb) * 128 + size_t(b) * 64 + 32 * h + 16 * k);
    const auto* scales = reinterpret_cast<const int8_t*>(row + size_t(nb) * 192 + size_t(b) * 16);
    r.sa = __ldg(scales + 8 * h + 2 * p + k);
    r.sb = __ldg(scales + 8 * h + 2 * (p + 2) + k);
    r.d = __ldg(reinterpret_cast<const unsigned short*>(row + size_t(nb) * 208) + b);
  }
  __device__ static void unit(const Raw& r, int u, Unit& w) {
    const int b = u >> 3, j = u & 7, h = j >> 2, p = (j >> 1) & 1;
    const unsigned lo_shift = unsigned(2 * p), hi_shift = unsigned(2 * p + 4);
    auto lo = [&](unsigned q, unsigned qh) { return (q & 0x0f0f0f0fu) | (((qh >> lo_shift) & 0x03030303u) << 4); };
    auto hi = [&](unsigned q, unsigned qh) { return ((q >> 4) & 0x0f0f0f0fu) | (((qh >> hi_shift) & 0x03030303u) << 4); };
    w.qa = make_uint4(lo(r.ql.x, r.qh.x), lo(r.ql.y, r.qh.y), lo(r.ql.z, r.qh.z), lo(r.ql.w, r.qh.w));
    w.qb = make_uint4(hi(r.ql.x, r.qh.x), hi(r.ql.y, r.qh.y), hi(r.ql.z, r.qh.z), hi(r.ql.w, r.qh.w));
    const float d = half_bits(r.d);
    w.ga = b * 8 + 4 * h + p, w.gb = w.ga + 2, w.oa = w.ob = 16 * (j & 1);
    w.da = __fmul_rn(d, float(r.sa)), w.db = __fmul_rn(d, float(r.sb));
    w.ma = w.mb = 0.f;
    w.bias = 32, w.is_signed = false;
  }
};

/// Q8_0, planar rows: qs [nb][32] (int8), d [nb] (fp16). Unit u is block u.
struct Q80 {
  __device__ static int64_t row_bytes(int cols) { return quant_row_bytes(QType::Q8_0, cols); }
  struct Raw {
    uint4 qa, qb;
    unsigned d;
  };
  __device__ static void load(const uint8_t* row, int u, int cols, Raw& r) {
    r.qa = ld16(row + size_t(u) * 32);
    r.qb = ld16(row + size_t(u) * 32 + 16);
    r.d = __ldg(reinterpret_cast<const unsigned short*>(row + size_t(cols)) + u);
  }
  __device__ static void unit(const Raw& r, int u, Unit& w) {
    w.qa = r.qa, w.qb = r.qb;
    w.ga = w.gb = u, w.oa = 0, w.ob = 16;
    w.da = w.db = half_bits(r.d);
    w.ma = w.mb = 0.f;
    w.bias = 0, w.is_signed = true;
  }
};

/// Integer i (< 16) of a half's bytes.
__device__ __forceinline__ int q_at(const uint4& q, int i, bool is_signed) {
  const unsigned b = byte_of(q, i);
  return is_signed ? int(int8_t(b)) : int(b);
}

/// Value i of a half, as the CPU dequantizer computes it (no contraction).
__device__ __forceinline__ float value_at(const uint4& q, int i, float d, float m, int bias, bool is_signed) {
  return __fsub_rn(__fmul_rn(d, float(q_at(q, i, is_signed) - bias)), m);
}

}  // namespace fdl::cuda::quant
