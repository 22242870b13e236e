// panels_vnni.h — internal: what the AVX-512 VNNI panel kernels share (q8k_panels_vnni.cpp,
// q80_panels_vnni.cpp): a 4-byte broadcast, and the pass over a matrix's panels in token
// groups of 8, 4, 2 and 1, each group meeting a panel while it is in L1/L2.
// Include only from a *_vnni.cpp file: everything here is TU-local.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "backend/cpu/q8k_panels.h"

// GCC 12's AVX-512 intrinsics pass an `_mm512_undefined_*()` (a self-initialized variable) as
// the unused source of their unmasked forms, which -Wmaybe-uninitialized reports once inlined
// into the including file's kernels: off for that whole file, on purpose.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace fdl::cpu::detail {
namespace {

// The 4 bytes at p in every 32-bit lane.
__m512i bcast32(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// Y[t * W.rows + r] for rows [row_begin, row_end) (whole panels): per panel
// (panel_bytes each), tokens(std::integral_constant<int, T>, panel, t0, acc) adds tokens
// t0 .. t0 + T - 1 into acc[T] (lane r: the panel's row r), stored after each group.
template <typename Tokens>
void panels_by_token_groups(const char* name, const WeightMatrix& W, size_t panel_bytes, int64_t n_tokens, float* Y,
                            int64_t row_begin, int64_t row_end, Tokens&& tokens) {
  check_panel_rows(name, W.rows, row_begin, row_end);
  const auto* base = static_cast<const uint8_t*>(W.data);
  for (int64_t p = row_begin / kPanelRows; p < row_end / kPanelRows; ++p) {
    const uint8_t* panel = base + size_t(p) * panel_bytes;
    auto group = [&](auto size, int64_t t0) {
      constexpr int T = decltype(size)::value;
      __m512 acc[T];
      for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
      tokens(size, panel, t0, acc);
      for (int t = 0; t < T; ++t) _mm512_storeu_ps(Y + (t0 + t) * W.rows + p * kPanelRows, acc[t]);
    };
    int64_t t = 0;
    for (; t + 8 <= n_tokens; t += 8) group(std::integral_constant<int, 8>{}, t);
    if (t + 4 <= n_tokens) group(std::integral_constant<int, 4>{}, t), t += 4;
    if (t + 2 <= n_tokens) group(std::integral_constant<int, 2>{}, t), t += 2;
    if (t < n_tokens) group(std::integral_constant<int, 1>{}, t);
  }
}

}  // namespace
}  // namespace fdl::cpu::detail
