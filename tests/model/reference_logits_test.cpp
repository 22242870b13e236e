// Full logit vectors must match llama.cpp's fp32 configuration (`f32_kv_fa_off`) for every
// case and step of stories260K_logits.json.
//
// Precision measure: relative error = max_i |ours_i - ref_i| / max_i |ref_i| over the whole
// vector of one step (an L-infinity error relative to the vector's scale; per-element
// relative error would be meaningless for logits near zero). Required: <= 1e-4.
#include <cmath>

#include "backend/cpu/cpu_features.h"
#include "model/model_test_util.h"

namespace fdl::test {
namespace {

// Runs with the AVX2 kernels where the CPU has them, and with the portable kernels forced.
class ReferenceLogits : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { cpu::force_portable_kernels(GetParam()); }
  void TearDown() override { cpu::force_portable_kernels(false); }
};

TEST_P(ReferenceLogits, Stories260KMatchesLlamaCppF32) {
  std::cout << "  kernels: " << cpu::kernel_set_name() << "\n";
  const nlohmann::json ref = load_reference("stories260K_logits.json");
  Model& m = shared_model("stories260K.gguf");
  ASSERT_EQ(ref["n_vocab"].get<int>(), m.config().n_vocab);
  double worst_rel = 0, worst_abs = 0;
  for (const auto& c : ref["cases"]) {
    const auto prompt = c["prompt_token_ids"].get<std::vector<int32_t>>();
    const auto& steps = c["configs"]["f32_kv_fa_off"]["logits"];
    auto pool = make_pool(m, prompt.size() + steps.size());
    KvCache kv(*pool);
    std::vector<std::vector<float>> ours;
    const auto ids = greedy_decode(m, kv, prompt, int(steps.size()), false, &ours);
    // The reference feeds its own greedy tokens; ours must be the same ones.
    EXPECT_EQ(std::vector<int32_t>(ids.begin(), ids.begin() + 3),
              c["greedy_tokens_first3"].get<std::vector<int32_t>>());
    for (size_t k = 0; k < steps.size(); ++k) {
      const auto expected = steps[k].get<std::vector<float>>();
      ASSERT_EQ(ours[k].size(), expected.size());
      double max_diff = 0, max_ref = 0;
      for (size_t i = 0; i < expected.size(); ++i) {
        max_diff = std::max(max_diff, std::fabs(double(ours[k][i]) - expected[i]));
        max_ref = std::max(max_ref, std::fabs(double(expected[i])));
      }
      const double rel = max_diff / max_ref;
      std::cout << "  " << c["id"].get<std::string>() << " step " << k << ": max abs diff "
                << max_diff << ", relative " << rel << "\n";
      EXPECT_LE(rel, 1e-4) << c["id"] << " step " << k;
      worst_rel = std::max(worst_rel, rel);
      worst_abs = std::max(worst_abs, max_diff);
    }
  }
  std::cout << "  worst: max abs diff " << worst_abs << ", relative " << worst_rel << "\n";
}

INSTANTIATE_TEST_SUITE_P(Kernels, ReferenceLogits, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "portable" : "native"; });

}  // namespace
}  // namespace fdl::test
