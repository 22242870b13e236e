// SamplingParams::validate: defaults pass, each bad value is rejected naming its parameter.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>

#include "flashdllm/sampling.h"

namespace fdl {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

void expect_rejected(const std::function<void(SamplingParams&)>& mutate, const std::string& name) {
  SamplingParams p;
  mutate(p);
  try {
    p.validate();
    ADD_FAILURE() << "expected " << name << " to be rejected";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
  }
}

TEST(SamplingParams, DefaultsAndOffValuesAreValid) {
  SamplingParams p;
  EXPECT_NO_THROW(p.validate());
  p.temperature = 0.0f;  // greedy
  p.top_p = 1.0f;
  p.min_p = 1.0f;
  p.repeat_last_n = -1;
  p.frequency_penalty = -2.0f;
  EXPECT_NO_THROW(p.validate());
}

TEST(SamplingParams, RejectsEachBadValueByName) {
  expect_rejected([](auto& p) { p.temperature = -0.5f; }, "temperature");
  expect_rejected([](auto& p) { p.temperature = kNaN; }, "temperature");
  expect_rejected([](auto& p) { p.temperature = kInf; }, "temperature");
  expect_rejected([](auto& p) { p.top_k = -1; }, "top_k");
  expect_rejected([](auto& p) { p.top_p = 0.0f; }, "top_p");
  expect_rejected([](auto& p) { p.top_p = 1.5f; }, "top_p");
  expect_rejected([](auto& p) { p.top_p = kNaN; }, "top_p");
  expect_rejected([](auto& p) { p.min_p = -0.1f; }, "min_p");
  expect_rejected([](auto& p) { p.min_p = 1.1f; }, "min_p");
  expect_rejected([](auto& p) { p.repeat_penalty = 0.0f; }, "repeat_penalty");
  expect_rejected([](auto& p) { p.repeat_penalty = kNaN; }, "repeat_penalty");
  expect_rejected([](auto& p) { p.repeat_last_n = -2; }, "repeat_last_n");
  expect_rejected([](auto& p) { p.frequency_penalty = kInf; }, "frequency_penalty");
  expect_rejected([](auto& p) { p.presence_penalty = kNaN; }, "presence_penalty");
}

TEST(SamplingParams, SamplerConstructorValidates) {
  SamplingParams p;
  p.top_p = 2.0f;
  EXPECT_THROW(Sampler(p, 10), std::invalid_argument);
  EXPECT_THROW(Sampler(SamplingParams{}, 0), std::invalid_argument);
  // A row's integer probabilities (2^44 per unit of weight) must fit 64 bits.
  EXPECT_THROW(Sampler(SamplingParams{}, 1 << 20), std::invalid_argument);
  EXPECT_NO_THROW(Sampler(SamplingParams{}, (1 << 20) - 1));
}

}  // namespace
}  // namespace fdl
