// op_profiler.h — device time per op class of the CUDA model's forwards
// (FLASHDLLM_CUDA_PROFILE=1, cuda_knobs.h; graphs are then off, so every op is a launch).
//
// mark(kind) records an event on the compute stream closing an op of `kind`; collect(), after
// a synchronize, adds the time between consecutive events to the class of the op the later
// one closes (the first event of a step only opens it), and sums over the forwards since the
// last reset(). Disabled, mark and collect do nothing and totals() is empty.
// Units: milliseconds. Errors: CudaError. Thread-safety: none (the model's thread).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace fdl::cuda {

/// The op classes, in totals()' order.
enum ProfKind {
  kEmbed, kNorm, kQkv, kRope, kAttention, kWo, kAttnBlock, kRoute, kGateUp, kSilu, kDown, kFfnBlock, kOutput, kSample,
  kUpload,
  kProfKinds
};

class OpProfiler {
 public:
  OpProfiler(cudaStream_t stream, bool enabled);
  ~OpProfiler();
  OpProfiler(const OpProfiler&) = delete;
  OpProfiler& operator=(const OpProfiler&) = delete;

  bool enabled() const { return enabled_; }
  /// Records an event closing an op of `kind` (a ProfKind).
  void mark(int kind);
  /// After a synchronize: adds the marked ops' times to their classes.
  void collect();
  /// (class name, milliseconds) per op class: embed, norm, qkv, rope, attention, wo,
  /// attn_block, route (a mixture of experts' router, top-k and grouping), gate_up, silu, down,
  /// ffn_block, output, sample, upload.
  std::vector<std::pair<std::string, double>> totals() const;
  void reset();

 private:
  cudaStream_t stream_;
  bool enabled_;
  std::vector<cudaEvent_t> events_;
  std::vector<int> kinds_;
  size_t used_ = 0;
  std::vector<double> ms_;
};

}  // namespace fdl::cuda
