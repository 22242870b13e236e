// codelm-16m's llama-quantize files on the GPU, whose Q8_0, Q4_K, Q5_K and Q6_K matrices stay
// block-quantized in device memory (gemv_quant; dequantized F16 tiles for prompts), against
// llama.cpp's greedy text (quant_reference_check.h) and its KL divergence from the F16 file
// (quant_kl_check.h).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/cuda_model.h"
#include "engine/quant_kl_check.h"
#include "engine/quant_reference_check.h"
#include "gpu/gpu_test_util.h"

namespace fdl {
namespace {

class CudaQuantized : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaQuantized, CodeLmFollowsLlamaCppUpToNearTies) {
  FDL_SKIP_WITHOUT_GPU();
  test::expect_quantized_codelm_follows_llama_cpp(GetParam(),
                                                  ModelOptions{.device = Device::Cuda, .batch_invariant = false});
}

TEST_P(CudaQuantized, KlDivergenceFromF16WithinLlamaCpps) {
  FDL_SKIP_WITHOUT_GPU();
  test::expect_quantized_kl_within_llama_cpp(GetParam(), ModelOptions{.device = Device::Cuda, .batch_invariant = false});
}

const cuda::CudaModel& as_cuda(const Model& m) { return dynamic_cast<const cuda::CudaModel&>(m); }

// The same file loaded with FLASHDLLM_CUDA_QUANT=0, every matrix widened to F16.
std::unique_ptr<Model> load_widened(const std::string& file, const ModelOptions& opt) {
  ::setenv("FLASHDLLM_CUDA_QUANT", "0", 1);
  auto m = Model::load(test::model_path(file), opt);
  ::unsetenv("FLASHDLLM_CUDA_QUANT");
  return m;
}

// Q8_0 (every matrix Q8_0) stays block-quantized: about 34/64 of its bytes widened, and no
// batch invariance; Q4_0 (Q4_0 layers, widened; a Q8_0 embedding) is widened whole, so it keeps
// the widened bytes and the invariant kernels.
TEST(CudaQuantizedResidency, KeptTypesStayQuantizedAndWidenedModelsStayInvariant) {
  FDL_SKIP_WITHOUT_GPU();
  const ModelOptions opt{.device = Device::Cuda, .batch_invariant = true};
  const auto q8 = Model::load(test::model_path("codelm-16m-Q8_0.gguf"), opt);
  const auto q8_wide = load_widened("codelm-16m-Q8_0.gguf", opt);
  EXPECT_LT(as_cuda(*q8).weight_bytes(), as_cuda(*q8_wide).weight_bytes() * 6 / 10);
  EXPECT_FALSE(q8->batch_invariant());
  EXPECT_TRUE(q8_wide->batch_invariant());
  const auto q4 = Model::load(test::model_path("codelm-16m-Q4_0.gguf"), opt);
  const auto q4_wide = load_widened("codelm-16m-Q4_0.gguf", opt);
  EXPECT_EQ(as_cuda(*q4).weight_bytes(), as_cuda(*q4_wide).weight_bytes());
  EXPECT_TRUE(q4->batch_invariant());
}

// The largest difference between two models' logits at every position of `ids`, as a share
// of the largest logit of that position (their GEMMs sum in different orders).
void expect_same_logits(Model& a_model, Model& b_model, const std::vector<int32_t>& ids) {
  const std::vector<float> a = test::every_position_logits(a_model, ids), b = test::every_position_logits(b_model, ids);
  ASSERT_EQ(a.size(), b.size());
  const int n_vocab = a_model.config().n_vocab;
  for (size_t t = 0; t < ids.size(); ++t) {
    const float* ra = a.data() + t * size_t(n_vocab);
    const float* rb = b.data() + t * size_t(n_vocab);
    float scale = 0.f, diff = 0.f;
    for (int i = 0; i < n_vocab; ++i) {
      scale = std::max(scale, std::fabs(ra[i]));
      diff = std::max(diff, std::fabs(ra[i] - rb[i]));
    }
    EXPECT_LE(diff, 1e-3f * scale) << "position " << t;
  }
}

std::vector<int32_t> prompt_ids(int n) {
  std::vector<int32_t> ids;
  for (int i = 0; i < n; ++i) ids.push_back(100 + 37 * (i % 40) + i / 40);
  return ids;
}

// Steps above kGemmQuantMaxTokens dequantize in tiles (FLASHDLLM_DEQUANT_TILE_MB): many small
// tiles give the logits of one large tile up to the GEMMs' summation order.
TEST(CudaQuantizedResidency, DequantizedTilesOfAnySizeGiveTheSameLogits) {
  FDL_SKIP_WITHOUT_GPU();
  const ModelOptions opt{.device = Device::Cuda, .batch_invariant = false};
  const auto whole = Model::load(test::model_path("codelm-16m-Q8_0.gguf"), opt);
  ::setenv("FLASHDLLM_DEQUANT_TILE_MB", "1", 1);
  const auto tiled = Model::load(test::model_path("codelm-16m-Q8_0.gguf"), opt);
  ::unsetenv("FLASHDLLM_DEQUANT_TILE_MB");
  expect_same_logits(*whole, *tiled, prompt_ids(160));
}

// Steps of 17-128 tokens that multiply the blocks directly (gemm_quant, FLASHDLLM_GEMM_QUANT=1)
// give the logits of the tiles up to the summation order, for a K-quant mix and for Q8_0.
TEST(CudaQuantizedResidency, BatchedStepsGiveTheLogitsOfTheTiles) {
  FDL_SKIP_WITHOUT_GPU();
  const ModelOptions opt{.device = Device::Cuda, .batch_invariant = false};
  for (const char* file : {"codelm-16m-Q4_K_M.gguf", "codelm-16m-Q8_0.gguf"}) {
    SCOPED_TRACE(file);
    ::setenv("FLASHDLLM_GEMM_QUANT", "1", 1);
    const auto direct = Model::load(test::model_path(file), opt);
    ::setenv("FLASHDLLM_GEMM_QUANT", "0", 1);
    const auto tiles = Model::load(test::model_path(file), opt);
    ::unsetenv("FLASHDLLM_GEMM_QUANT");
    expect_same_logits(*direct, *tiles, prompt_ids(40));
    expect_same_logits(*direct, *tiles, prompt_ids(128));
    EXPECT_GT(as_cuda(*direct).gemm_quant_matmuls(), 0u) << "the steps went through the F16 tiles";
    EXPECT_EQ(as_cuda(*tiles).gemm_quant_matmuls(), 0u);
  }
}

std::string file_test_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string name = info.param.substr(std::string("codelm-16m-").size());
  return name.substr(0, name.find('.'));
}

INSTANTIATE_TEST_SUITE_P(CodeLm16M, CudaQuantized, ::testing::ValuesIn(test::quantized_codelm_files()), file_test_name);

}  // namespace
}  // namespace fdl
