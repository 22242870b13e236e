// row_loads.cuh — one block streaming one row of floats (a logits row) at full speed.
//
// A single block has only one SM's loads in flight, so a row of ~128k floats read one
// 4-byte load per thread at a time is latency-bound (~16 KB in flight per L2 round trip).
// for_each_in_row makes 16-byte loads, four per thread before using any, and calls
// f(index, value) for every element (in no particular order across threads; in increasing
// index order within a thread).
#pragma once

#include <cstdint>

namespace fdl::cuda {

// 16-byte loads where the row allows (4 floats per thread per step, all threads in flight).
template <int kThreads, typename F>
__device__ __forceinline__ void for_each_in_row(const float* row, int n, F f) {
  const bool aligned = (reinterpret_cast<uintptr_t>(row) & 15u) == 0;
  const int n4 = aligned ? n / 4 : 0;
  const float4* row4 = reinterpret_cast<const float4*>(row);
  auto each = [&](int j, const float4& q) {
    f(4 * j, q.x);
    f(4 * j + 1, q.y);
    f(4 * j + 2, q.z);
    f(4 * j + 3, q.w);
  };
  int j = int(threadIdx.x);
  for (; j + 3 * kThreads < n4; j += 4 * kThreads) {  // four 16-byte loads in flight per thread
    const float4 q0 = __ldg(row4 + j), q1 = __ldg(row4 + j + kThreads), q2 = __ldg(row4 + j + 2 * kThreads),
                 q3 = __ldg(row4 + j + 3 * kThreads);
    each(j, q0);
    each(j + kThreads, q1);
    each(j + 2 * kThreads, q2);
    each(j + 3 * kThreads, q3);
  }
  for (; j < n4; j += kThreads) each(j, __ldg(row4 + j));
  for (int i = 4 * n4 + int(threadIdx.x); i < n; i += kThreads) f(i, __ldg(row + i));
}

}  // namespace fdl::cuda
