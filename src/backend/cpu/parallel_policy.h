// parallel_policy.h — whether a kernel call is big enough to split across the thread pool.
//
// Handing work to another thread has a fixed cost: publishing the job and waiting for the
// last chunk (~0.1 µs when the worker spins), and above all moving the activations between
// the cores — the worker reads the input the caller just wrote, the caller then reads the
// rows the worker wrote. bench/micro/parallel_split.cpp measures it: stories260K's 172x64
// F32 matmul at 6 tokens takes 3.0 µs on one thread and 3.0 µs split; inside a forward the
// split cost ~8 µs more per call (a 2-thread 6-token verification ran 206 µs instead of
// 166). So the decision is made on an estimate of the call's serial time in nanoseconds —
// from its multiply-adds and the bytes it streams — never on a token count, and only calls
// estimated above kParallelMinNs are split. codelm-16m's matrices are all far above it
// (384x384 F16: 8 µs for one token, split 0.65x of serial).
// The decision never changes results: every kernel is batch- and thread-invariant.
// Thread-safety: pure functions.
#pragma once

#include <cstdint>

#include "backend/cpu/matmul.h"
#include "backend/cpu/thread_pool.h"

namespace fdl::cpu {

/// Estimated serial time (ns) below which a call runs on the calling thread alone.
inline constexpr double kParallelMinNs = 8000.0;  // 4000 still split the 172x64 FFN pair

/// Estimated single-thread time in ns of matmul(W, n_tokens): multiply-adds at the direct
/// kernels' measured rate plus the weight bytes at the rate they stream from L2/L3.
double matmul_cost_ns(const WeightMatrix& W, int64_t n_tokens);

/// Estimated single-thread time in ns of paged attention over `total_positions` (token,
/// position) pairs for n_head heads of head_dim floats each.
double attention_cost_ns(int64_t total_positions, int n_head, int head_dim);

/// True when a call estimated at `serial_ns` should be split across `pool`.
inline bool worth_splitting(const ThreadPool& pool, double serial_ns) {
  return pool.size() > 1 && serial_ns >= kParallelMinNs;
}

}  // namespace fdl::cpu
