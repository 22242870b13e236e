// Cost estimates behind parallel_policy.h. Rates measured on the development machine (Zen 4
// VM, AVX2 kernels) with bench/micro/parallel_split.cpp; only their order of magnitude
// matters, the threshold has a wide margin.
#include "backend/cpu/parallel_policy.h"

namespace fdl::cpu {
namespace {

// The sum of both terms, not their max: small shapes pay both (bench_parallel_split:
// stories260K's 172x64 F32 at 6 tokens 2.2 µs, estimate 2.1; codelm-16m's 8192x384 F16 at
// 1 token 110 µs, estimate 120; at 6 tokens 370 µs, estimate 490).
constexpr double kMacsPerNs = 50.0;         // direct kernels, one thread, weights in cache
constexpr double kWeightBytesPerNs = 55.0;  // streaming (and widening) weights from L2/L3
// Attention: a fixed part per (position, head) — softmax, score stores, V loads — plus the
// QK and PV multiply-adds.
constexpr double kAttnNsPerHeadPos = 1.0;
constexpr double kAttnMacsPerNs = 16.0;

}  // namespace

double matmul_cost_ns(const WeightMatrix& W, int64_t n_tokens) {
  const double macs = double(W.rows) * double(W.cols) * double(n_tokens);
  const double bytes = double(weight_row_bytes(W.type, W.cols)) * double(W.rows);
  return macs / kMacsPerNs + bytes / kWeightBytesPerNs;
}

double attention_cost_ns(int64_t total_positions, int n_head, int head_dim) {
  const double pairs = double(total_positions) * double(n_head);
  return pairs * kAttnNsPerHeadPos + pairs * 2.0 * double(head_dim) / kAttnMacsPerNs;
}

}  // namespace fdl::cpu
