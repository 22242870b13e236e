// A model file's recommended sampling (general.sampling.*): read with range checks, applied
// over a caller's defaults field by field.
#include <gtest/gtest.h>

#include "model/sampling_defaults.h"
#include "flashdllm/model.h"

namespace fdl::test {
namespace {

GgufFile file_with(void (*keys)(GgufWriter&)) {
  GgufWriter w;
  w.set_string("general.architecture", "llama");
  keys(w);
  return GgufFile::from_bytes(w.to_bytes("sampling.gguf"), "sampling.gguf");
}

TEST(ModelSamplingDefaults, ReadAndAppliedOverTheCallersDefaults) {
  const GgufFile f = file_with([](GgufWriter& w) {
    w.set_float32("general.sampling.temp", 0.6f);
    w.set_int32("general.sampling.top_k", 20);
    w.set_float32("general.sampling.top_p", 0.95f);
    w.set_float32("general.sampling.penalty_repeat", 1.1f);
  });
  const ModelSamplingDefaults d = model_sampling_defaults(f);
  ASSERT_TRUE(d.temperature && d.top_k && d.top_p && d.repeat_penalty);
  EXPECT_FALSE(d.min_p.has_value());
  const SamplingParams p = with_model_defaults(SamplingParams{.min_p = 0.05f, .seed = 7}, d);
  EXPECT_FLOAT_EQ(p.temperature, 0.6f);
  EXPECT_EQ(p.top_k, 20);
  EXPECT_FLOAT_EQ(p.top_p, 0.95f);
  EXPECT_FLOAT_EQ(p.min_p, 0.05f);  // not set by the model: the caller's
  EXPECT_FLOAT_EQ(p.repeat_penalty, 1.1f);
  EXPECT_EQ(p.seed, 7u);
  EXPECT_TRUE(model_sampling_defaults(file_with([](GgufWriter&) {})).empty());
}

TEST(ModelSamplingDefaults, BadValuesNameTheKey) {
  const auto error = [](void (*keys)(GgufWriter&)) {
    try {
      model_sampling_defaults(file_with(keys));
    } catch (const ModelError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error([](GgufWriter& w) { w.set_float32("general.sampling.top_p", 0.f); })
                .find("'general.sampling.top_p' = 0.000000 is out of range"),
            std::string::npos);
  EXPECT_NE(error([](GgufWriter& w) { w.set_float32("general.sampling.temp", -1.f); })
                .find("'general.sampling.temp'"),
            std::string::npos);
  EXPECT_NE(error([](GgufWriter& w) { w.set_int32("general.sampling.top_k", -5); }).find("'general.sampling.top_k'"),
            std::string::npos);
  EXPECT_NE(error([](GgufWriter& w) { w.set_string("general.sampling.min_p", "low"); })
                .find("'general.sampling.min_p' must be a number"),
            std::string::npos);
}

}  // namespace
}  // namespace fdl::test
