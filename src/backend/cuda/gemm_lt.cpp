// LtGemm (gemm_lt.h): a cuBLASLt plan per shape, its algorithm picked by timing.
#include "backend/cuda/gemm_lt.h"

#include <algorithm>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.h"

namespace fdl::cuda {
namespace {

#define FDL_LT_CHECK(call) FDL_CUBLAS_CHECK(call)

constexpr int kCandidates = 12;  // heuristic results considered
constexpr int kTimedRuns = 5;    // per candidate, after one warm-up run; the median counts

// Tuning buckets: 17..32, 33..64, 65..128, 129..256 tokens (and powers of two beyond).
int bucket_of(int n) {
  int b = 32;
  while (b < n) b *= 2;
  return b;
}

}  // namespace

LtGemm::LtGemm(cudaStream_t stream, void* workspace, size_t workspace_bytes)
    : stream_(stream), workspace_(workspace), workspace_bytes_(workspace_bytes) {
  FDL_LT_CHECK(cublasLtCreate(&lt_));
}

LtGemm::~LtGemm() {
  for (auto& [key, p] : plans_) {
    cublasLtMatrixLayoutDestroy(p.a);
    cublasLtMatrixLayoutDestroy(p.b);
    cublasLtMatrixLayoutDestroy(p.c);
    cublasLtMatmulDescDestroy(p.op);
  }
  if (lt_) cublasLtDestroy(lt_);
}

void LtGemm::launch(const Plan& p, const cublasLtMatmulAlgo_t& algo, const DeviceMatrix& W, const void* X, float* Y) {
  const float alpha = 1.f, beta = 0.f;
  FDL_LT_CHECK(cublasLtMatmul(lt_, p.op, &alpha, W.data, p.a, X, p.b, &beta, Y, p.c, Y, p.c, &algo, workspace_,
                              workspace_bytes_, stream_));
}

LtGemm::Plan& LtGemm::plan_for(const DeviceMatrix& W, const void* X, int n, float* Y) {
  const auto key = std::make_tuple(W.rows, W.cols, int(W.type), n);
  if (auto it = plans_.find(key); it != plans_.end()) return it->second;

  if (W.type != WType::F16 && W.type != WType::BF16) throw CudaError("LtGemm: weights must be F16 or BF16");

  // Column-major view: Yᵀ [rows][n] = op(A)·B, A = W stored as [cols][rows] (ld cols) with
  // op T, B = Xᵀ [cols][n] (ld cols), C = D = Yᵀ fp32 (ld rows).
  const cudaDataType_t t = W.type == WType::F16 ? CUDA_R_16F : CUDA_R_16BF;
  Plan p;
  FDL_LT_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
  FDL_LT_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof(op_t)));
  FDL_LT_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof(op_n)));
  FDL_LT_CHECK(cublasLtMatrixLayoutCreate(&p.a, t, uint64_t(W.cols), uint64_t(W.rows), int64_t(W.cols)));
  FDL_LT_CHECK(cublasLtMatrixLayoutCreate(&p.b, t, uint64_t(W.cols), uint64_t(n), int64_t(W.cols)));
  FDL_LT_CHECK(cublasLtMatrixLayoutCreate(&p.c, CUDA_R_32F, uint64_t(W.rows), uint64_t(n), int64_t(W.rows)));

  cublasLtMatmulPreference_t pref = nullptr;
  FDL_LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = workspace_bytes_;
  FDL_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  std::vector<cublasLtMatmulHeuristicResult_t> cand(kCandidates);
  int found = 0;
  const cublasStatus_t hs =
      cublasLtMatmulAlgoGetHeuristic(lt_, p.op, p.a, p.b, p.c, p.c, pref, kCandidates, cand.data(), &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (hs != CUBLAS_STATUS_SUCCESS || found == 0) {
    cublasLtMatrixLayoutDestroy(p.a), cublasLtMatrixLayoutDestroy(p.b), cublasLtMatrixLayoutDestroy(p.c);
    cublasLtMatmulDescDestroy(p.op);
    throw CudaError("LtGemm: no cuBLASLt algorithm for " + std::to_string(W.rows) + "x" + std::to_string(W.cols) +
                    " n=" + std::to_string(n));
  }

  // One timed choice per (W, bucket of n): later n of the bucket reuse it when cuBLASLt
  // confirms the algorithm supports their layout, else take the heuristic's first choice.
  // Under graph capture nothing can be timed: the heuristic's first choice, not remembered
  // as tuned.
  try {
    const auto tkey = std::make_tuple(W.rows, W.cols, int(W.type), bucket_of(n));
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    FDL_CUDA_CHECK(cudaStreamIsCapturing(stream_, &capturing));
    p.algo = cand[0].algo;
    if (auto t = tuned_.find(tkey); t != tuned_.end()) {
      cublasLtMatmulHeuristicResult_t check{};
      if (cublasLtMatmulAlgoCheck(lt_, p.op, p.a, p.b, p.c, p.c, &t->second, &check) == CUBLAS_STATUS_SUCCESS &&
          check.workspaceSize <= workspace_bytes_)
        p.algo = t->second;
    } else if (capturing == cudaStreamCaptureStatusNone) {
      p.algo = fastest(p, cand, found, W, X, Y);
      tuned_.emplace(tkey, p.algo);
    }
  } catch (...) {
    cublasLtMatrixLayoutDestroy(p.a), cublasLtMatrixLayoutDestroy(p.b), cublasLtMatrixLayoutDestroy(p.c);
    cublasLtMatmulDescDestroy(p.op);
    throw;
  }
  return plans_.emplace(key, p).first->second;
}

cublasLtMatmulAlgo_t LtGemm::fastest(const Plan& p, const std::vector<cublasLtMatmulHeuristicResult_t>& cand,
                                     int found, const DeviceMatrix& W, const void* X, float* Y) {
  // Time each candidate on the real buffers; keep the fastest median.
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  FDL_CUDA_CHECK(cudaEventCreate(&e0));
  FDL_CUDA_CHECK(cudaEventCreate(&e1));
  struct Events {  // destroyed on every path out, including a failed candidate
    cudaEvent_t a, b;
    ~Events() { cudaEventDestroy(a), cudaEventDestroy(b); }
  } events{e0, e1};
  float best_ms = -1.f, total_ms = 0.f;
  int best = 0;
  for (int i = 0; i < found; ++i) {
    if (cand[size_t(i)].state != CUBLAS_STATUS_SUCCESS) continue;
    std::vector<float> ms(kTimedRuns);
    try {
      launch(p, cand[size_t(i)].algo, W, X, Y);  // warm-up
      for (float& t_ms : ms) {
        FDL_CUDA_CHECK(cudaEventRecord(e0, stream_));
        launch(p, cand[size_t(i)].algo, W, X, Y);
        FDL_CUDA_CHECK(cudaEventRecord(e1, stream_));
        FDL_CUDA_CHECK(cudaEventSynchronize(e1));
        FDL_CUDA_CHECK(cudaEventElapsedTime(&t_ms, e0, e1));
        total_ms += t_ms;
      }
    } catch (const CudaError&) {  // a candidate cuBLASLt refuses at run time: skip it
      continue;
    }
    std::nth_element(ms.begin(), ms.begin() + kTimedRuns / 2, ms.end());
    const float med = ms[kTimedRuns / 2];
    if (best_ms < 0.f || med < best_ms) best_ms = med, best = i;
  }
  tuning_ms_ += total_ms;
  if (best_ms < 0.f) throw CudaError("LtGemm: every cuBLASLt candidate failed to run");
  return cand[size_t(best)].algo;
}

void LtGemm::run(const DeviceMatrix& W, const void* X, int n, float* Y) {
  if (W.quantized()) throw CudaError("LtGemm: a block-quantized matrix (dequantize it first)");
  const Plan& p = plan_for(W, X, n, Y);
  launch(p, p.algo, W, X, Y);
}

}  // namespace fdl::cuda
