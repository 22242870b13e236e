// Models that `tools make-model --dtype` writes in every block-quantized type load and run, and
// their logits stay close to the F16 model made with the same seed (the same underlying
// values): each type's rounding error, not garbage from a wrong block layout.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "flashdllm/model.h"
#include "model/model_test_util.h"
#include "test_support.h"
#include "tools/make_model.h"

namespace fdl::test {
namespace {

std::vector<float> last_logits(GgmlType dtype) {
  tools::MakeModelOptions opt;
  opt.output = scratch_dir() / "quantized-twin.gguf";
  opt.dtype = dtype;
  opt.dim = 256, opt.ffn_dim = 512, opt.vocab = 600;  // K-quant rows: whole 256-element blocks
  opt.weight_std = 0.05f;
  tools::make_model(opt);
  auto m = Model::load(opt.output, ModelOptions{.n_threads = 2});
  return prefill_logits(*m, {1, 300, 17, 42, 599, 5});
}

TEST(QuantizedMakeModel, EveryTypeRunsCloseToItsF16Twin) {
  const std::vector<float> ref = last_logits(GgmlType::F16);
  // Bounds on the relative RMS distance of the last token's logits: ~1.5x what each type
  // measured (about 4x its weights' own relative error, QuantBlocks' round-trip test: every
  // matrix of the model adds its share). Logits of unrelated weights would read ~1.4.
  const std::vector<std::pair<GgmlType, double>> cases = {
      {GgmlType::Q8_0, 0.025}, {GgmlType::Q6_K, 0.085}, {GgmlType::Q5_0, 0.17}, {GgmlType::Q5_1, 0.17},
      {GgmlType::Q5_K, 0.17},  {GgmlType::Q4_0, 0.36},  {GgmlType::Q4_1, 0.36}, {GgmlType::Q4_K, 0.36},
      {GgmlType::Q3_K, 0.7},   {GgmlType::Q2_K, 1.2}};
  for (const auto& [dtype, bound] : cases) {
    const std::string name = ggml_type_name(static_cast<uint32_t>(dtype));
    SCOPED_TRACE(name);
    const std::vector<float> got = last_logits(dtype);
    ASSERT_EQ(got.size(), ref.size());
    double diff = 0, norm = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      diff += (double(got[i]) - ref[i]) * (double(got[i]) - ref[i]);
      norm += double(ref[i]) * ref[i];
    }
    const double rel = std::sqrt(diff / norm);
    std::printf("  %s: relative RMS distance of the logits from F16 %.4f\n", name.c_str(), rel);
    EXPECT_LT(rel, bound);
    EXPECT_GT(rel, 0.0);  // the weights really were quantized
  }
}

}  // namespace
}  // namespace fdl::test
