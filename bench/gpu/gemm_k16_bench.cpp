// gemm_k16_bench: every tiling of the batch-invariant GEMM (gemm_k16.h) on the projection
// shapes of a model, beside cuBLAS (cublasGemmEx, default algorithm, fp32 accumulation: what
// the fast path runs above 256 tokens) in the same process. Prints per shape and token count
// the median time of each, its weight bandwidth and its TFLOP/s.
//
//   gemm_k16_bench [--dim 4096] [--ffn 14336] [--kv-dim 1024] [--vocab 128256] [--tokens 1,64,512] [--reps 20]
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "int_list.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/gemm_k16.h"

namespace {

using fdl::cuda::DeviceBuffer;
using fdl::cuda::DeviceMatrix;
using fdl::cuda::WType;


template <typename F>
double median_ms(int reps, F&& f) {
  cudaEvent_t a, b;
  FDL_CUDA_CHECK(cudaEventCreate(&a));
  FDL_CUDA_CHECK(cudaEventCreate(&b));
  f();  // warm-up (and the kernels' one-time attribute set-up)
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    FDL_CUDA_CHECK(cudaEventRecord(a));
    f();
    FDL_CUDA_CHECK(cudaEventRecord(b));
    FDL_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    FDL_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int dim = 4096, ffn = 14336, kv_dim = 1024, vocab = 128256, reps = 20;
  std::vector<int> tokens{1, 64, 512};
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
      const std::string v = argv[++i];
      if (a == "--dim") dim = std::stoi(v);
      else if (a == "--ffn") ffn = std::stoi(v);
      else if (a == "--kv-dim") kv_dim = std::stoi(v);
      else if (a == "--vocab") vocab = std::stoi(v);
      else if (a == "--tokens") tokens = parse_int_list(v);
      else if (a == "--reps") reps = std::stoi(v);
      else throw std::invalid_argument("unknown argument " + a);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gemm_k16_bench: %s\n", e.what());
    return 2;
  }
  struct Proj {
    const char* name;
    int rows, cols;
  };
  const Proj projs[] = {{"qkv", dim + 2 * kv_dim, dim}, {"wo", dim, dim}, {"gate_up", 2 * ffn, dim},
                        {"down", dim, ffn}, {"output", vocab, dim}};
  cublasHandle_t h;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "gemm_k16_bench: cublasCreate failed\n");
    return 1;
  }
  std::mt19937 rng(1);
  const int max_n = *std::max_element(tokens.begin(), tokens.end());
  for (const Proj& p : projs) {
    std::vector<uint16_t> w(size_t(p.rows) * p.cols), x(size_t(max_n) * p.cols);
    for (auto& v : w) v = uint16_t(0x2000 + rng() % 0x1000);  // small positive/negative bf16 values
    for (auto& v : x) v = uint16_t((rng() % 2 ? 0x8000 : 0) | (0x3c00 + rng() % 0x200));
    DeviceBuffer<uint16_t> dw(w.size()), dx(x.size());
    DeviceBuffer<float> dy(size_t(max_n) * p.rows);
    FDL_CUDA_CHECK(cudaMemcpy(dw.get(), w.data(), w.size() * 2, cudaMemcpyHostToDevice));
    FDL_CUDA_CHECK(cudaMemcpy(dx.get(), x.data(), x.size() * 2, cudaMemcpyHostToDevice));
    const DeviceMatrix W{WType::BF16, dw.get(), p.rows, p.cols};
    size_t ws_floats = 1;  // the split tilings' per-segment chains
    for (int t = -1; t < fdl::cuda::gemm_k16_tilings(); ++t)
      ws_floats = std::max(ws_floats, fdl::cuda::gemm_k16_workspace_floats(W, max_n, t));
    DeviceBuffer<float> ws(ws_floats);
    const double bytes = double(p.rows) * p.cols * 2;
    for (int n : tokens) {
      const double flops = 2.0 * p.rows * p.cols * n;
      auto line = [&](const std::string& what, double ms) {
        std::printf("%-8s n=%-4d %-22s %8.3f ms %7.2f TB/s %7.1f TFLOP/s\n", p.name, n, what.c_str(), ms,
                    bytes / ms / 1e9, flops / ms / 1e9);
      };
      const float alpha = 1.f, beta = 0.f;
      line("cublasGemmEx", median_ms(reps, [&] {
             cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, p.rows, n, p.cols, &alpha, dw.get(), CUDA_R_16BF, p.cols,
                          dx.get(), CUDA_R_16BF, p.cols, &beta, dy.get(), CUDA_R_32F, p.rows, CUBLAS_COMPUTE_32F,
                          CUBLAS_GEMM_DEFAULT);
           }));
      line("gemm_k16 (picked)",
           median_ms(reps, [&] { fdl::cuda::gemm_k16(W, dx.get(), n, dy.get(), nullptr, -1, ws.get()); }));
      for (int t = 1; t < fdl::cuda::gemm_k16_tilings(); ++t)
        if (fdl::cuda::gemm_k16_tiling_available(t))
          line(fdl::cuda::gemm_k16_tiling_name(t),
             median_ms(reps, [&] { fdl::cuda::gemm_k16(W, dx.get(), n, dy.get(), nullptr, t, ws.get()); }));
    }
  }
  cublasDestroy(h);
  return 0;
}
