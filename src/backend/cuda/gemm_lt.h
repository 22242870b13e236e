// gemm_lt.h — Y = X·Wᵀ for 16-bit weights through cuBLASLt, with the algorithm chosen by
// timing cuBLASLt's heuristic candidates on the first call of each weight shape and bucket
// of token counts (autotuning).
//
// Why: for the skinny products of batched decode (17..256 tokens against 4096 x 28672
// weights, memory bound: each weight byte read once is the floor) the default algorithm
// cublasGemmEx picks was measured at ~1.6 TB/s on the H200 — below half the HBM bandwidth —
// whereas other cuBLASLt kernels for the same problem stream faster. Large prompts are
// compute bound and keep the default (the first candidate usually wins there anyway).
//
// Shapes: W [rows][cols] row-major, F16 or BF16; X [n][cols] in W's type; Y [n][rows] fp32;
// fp32 accumulation (CUBLAS_COMPUTE_32F), as the cublasGemmEx path. Different algorithms sum
// in different orders, so results may differ from cublasGemmEx's in the last bits. Within one
// object a (W shape, n) keeps its algorithm once chosen, but the choice is made by timing:
// two processes may pick different algorithms and differ in the last bits of their logits.
// Thread-safety: one object per stream, used by one thread at a time (like CudaModel).
// Errors: CudaError for any CUDA or cuBLASLt failure (and for weights not F16/BF16).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <tuple>
#include <vector>

#include "backend/cuda/kernels.h"

namespace fdl::cuda {

class LtGemm {
 public:
  /// `workspace` (device, `workspace_bytes`) is shared with the caller's other cuBLAS work on
  /// the same stream (never used concurrently).
  LtGemm(cudaStream_t stream, void* workspace, size_t workspace_bytes);
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  /// Y = X·Wᵀ on the stream. The first call for a W shape and a bucket of n (17..32, 33..64,
  /// 65..128, 129..256) tunes: it runs every candidate a few times on these very buffers (Y
  /// is overwritten by each; the final run writes the result) and synchronizes the stream.
  /// Other n of the bucket reuse that algorithm (checked with cublasLtMatmulAlgoCheck), so a
  /// server whose batch size varies tunes a few times, not once per size. A first call while
  /// the stream is being captured into a graph cannot time anything: it uses the heuristic's
  /// first choice (and tunes the bucket at a later uncaptured call of another n).
  void run(const DeviceMatrix& W, const void* X, int n, float* Y);

  /// Number of tuned (W shape, bucket) pairs, and the time tuning took in total (ms).
  size_t tuned_shapes() const { return tuned_.size(); }
  size_t plans() const { return plans_.size(); }
  double tuning_ms() const { return tuning_ms_; }

 private:
  struct Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  Plan& plan_for(const DeviceMatrix& W, const void* X, int n, float* Y);
  cublasLtMatmulAlgo_t fastest(const Plan& p, const std::vector<cublasLtMatmulHeuristicResult_t>& cand, int found,
                               const DeviceMatrix& W, const void* X, float* Y);
  void launch(const Plan& p, const cublasLtMatmulAlgo_t& algo, const DeviceMatrix& W, const void* X, float* Y);

  cudaStream_t stream_;
  void* workspace_;
  size_t workspace_bytes_;
  cublasLtHandle_t lt_ = nullptr;
  std::map<std::tuple<int64_t, int64_t, int, int>, Plan> plans_;  // (rows, cols, type, n)
  std::map<std::tuple<int64_t, int64_t, int, int>, cublasLtMatmulAlgo_t> tuned_;  // (rows, cols, type, bucket)
  double tuning_ms_ = 0.0;
};

}  // namespace fdl::cuda
