// codelm-16m's llama-quantize files on the GPU, whose Q8_0, Q4_K, Q5_K and Q6_K matrices stay
// block-quantized in device memory (gemv_quant; dequantized F16 tiles for prompts), against
// llama.cpp's greedy text (quant_reference_check.h).
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

std::string file_test_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string name = info.param.substr(std::string("codelm-16m-").size());
  return name.substr(0, name.find('.'));
}

INSTANTIATE_TEST_SUITE_P(CodeLm16M, CudaQuantized, ::testing::ValuesIn(test::quantized_codelm_files()), file_test_name);

}  // namespace
}  // namespace fdl
