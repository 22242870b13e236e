// The autotuned cuBLASLt GEMM (gemm_lt.h) against a double-precision reference on 16-bit
// inputs (exact as stored, so only the fp32 accumulation differs), for the skinny shapes of
// batched decode, odd sizes, and a second call of a tuned shape (the cached plan).
#include <cstring>
#include <iostream>

#include "backend/cuda/gemm_lt.h"
#include "flashdllm/dtype.h"
#include "gpu/gpu_test_util.h"

namespace fdl::test {
namespace {

using cuda::DeviceBuffer;
using cuda::WType;

std::vector<uint16_t> to_16bit(WType type, std::vector<float>& values) {
  std::vector<uint16_t> bits(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    bits[i] = type == WType::F16 ? fp32_to_fp16(values[i]) : fp32_to_bf16(values[i]);
    values[i] = type == WType::F16 ? fp16_to_fp32(bits[i]) : bf16_to_fp32(bits[i]);  // the exact inputs
  }
  return bits;
}

TEST(LtGemm, TunedPlansMatchDoubleReference) {
  FDL_SKIP_WITHOUT_GPU();
  cudaStream_t stream = nullptr;
  FDL_CUDA_CHECK(cudaStreamCreate(&stream));
  DeviceBuffer<uint8_t> ws(size_t(32) << 20);
  {
    cuda::LtGemm gemm(stream, ws.get(), size_t(32) << 20);
    struct Case {
      WType type;
      int rows, cols, n;
    };
    for (const Case& c : {Case{WType::BF16, 1000, 4096, 17}, Case{WType::F16, 4099, 384, 64},
                          Case{WType::BF16, 2048, 1024, 100}, Case{WType::F16, 96, 2056, 256},
                          Case{WType::BF16, 1000, 4096, 17},    // the cached plan
                          Case{WType::BF16, 1000, 4096, 30}}) {  // n=17's bucket: its algorithm
      std::vector<float> w = random_floats(size_t(c.rows) * c.cols), x = random_floats(size_t(c.n) * c.cols);
      const auto wb = to_16bit(c.type, w), xb = to_16bit(c.type, x);
      auto dW = to_device(wb), dX = to_device(xb);
      DeviceBuffer<float> dY(size_t(c.n) * c.rows);
      poison(dY);
      gemm.run(cuda::DeviceMatrix{c.type, dW.get(), c.rows, c.cols}, dX.get(), c.n, dY.get());
      FDL_CUDA_CHECK(cudaStreamSynchronize(stream));
      const std::vector<float> y = to_host(dY, size_t(c.n) * c.rows);
      std::vector<double> ref(y.size());
      for (int t = 0; t < c.n; ++t)
        for (int r = 0; r < c.rows; ++r) {
          double s = 0;
          for (int k = 0; k < c.cols; ++k) s += double(w[size_t(r) * c.cols + k]) * x[size_t(t) * c.cols + k];
          ref[size_t(t) * c.rows + r] = s;
        }
      EXPECT_LT(rel_error(y, ref), 1e-5) << c.rows << "x" << c.cols << " n=" << c.n;
    }
    EXPECT_EQ(gemm.tuned_shapes(), 4u);  // four (shape, bucket) pairs
    EXPECT_EQ(gemm.plans(), 5u);         // five (shape, n)
    std::cout << "  tuning took " << gemm.tuning_ms() << " ms for 4 shapes\n";
  }
  FDL_CUDA_CHECK(cudaStreamDestroy(stream));
}

// A shape first met while the stream is captured into a graph cannot be timed: the captured
// product uses the heuristic's choice and is still right when the graph runs; the bucket is
// tuned at the next uncaptured call of another n.
TEST(LtGemm, FirstCallUnderGraphCaptureUsesTheHeuristicChoice) {
  FDL_SKIP_WITHOUT_GPU();
  cudaStream_t stream = nullptr;
  FDL_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  DeviceBuffer<uint8_t> ws(size_t(32) << 20);
  const int rows = 384, cols = 512, n = 40;
  std::vector<float> w = random_floats(size_t(rows) * cols), x = random_floats(size_t(n) * cols);
  const auto wb = to_16bit(WType::BF16, w), xb = to_16bit(WType::BF16, x);
  auto dW = to_device(wb), dX = to_device(xb);
  DeviceBuffer<float> dY(size_t(n) * rows);
  poison(dY);
  {
    cuda::LtGemm gemm(stream, ws.get(), size_t(32) << 20);
    const cuda::DeviceMatrix W{WType::BF16, dW.get(), rows, cols};
    cudaGraph_t g = nullptr;
    FDL_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    try {
      gemm.run(W, dX.get(), n, dY.get());
    } catch (...) {
      cudaStreamEndCapture(stream, &g);
      throw;
    }
    FDL_CUDA_CHECK(cudaStreamEndCapture(stream, &g));
    cudaGraphExec_t exec = nullptr;
    FDL_CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
    FDL_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    FDL_CUDA_CHECK(cudaStreamSynchronize(stream));
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(g);
    EXPECT_EQ(gemm.tuned_shapes(), 0u);
    const std::vector<float> y = to_host(dY, size_t(n) * rows);
    std::vector<double> ref(y.size());
    for (int t = 0; t < n; ++t)
      for (int r = 0; r < rows; ++r) {
        double s = 0;
        for (int k = 0; k < cols; ++k) s += double(w[size_t(r) * cols + k]) * x[size_t(t) * cols + k];
        ref[size_t(t) * rows + r] = s;
      }
    EXPECT_LT(rel_error(y, ref), 1e-5);
    gemm.run(W, dX.get(), n - 1, dY.get());  // uncaptured, same bucket: tunes it now
    FDL_CUDA_CHECK(cudaStreamSynchronize(stream));
    EXPECT_EQ(gemm.tuned_shapes(), 1u);
  }
  FDL_CUDA_CHECK(cudaStreamDestroy(stream));
}

}  // namespace
}  // namespace fdl::test
