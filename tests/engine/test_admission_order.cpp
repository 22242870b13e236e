// Admission order (src/engine/admission_order.h) and prompt SimHash, as pure functions.
#include <gtest/gtest.h>

#include <random>

#include "engine/admission_order.h"
#include "engine/prompt_simhash.h"

namespace fdl::engine {
namespace {

std::vector<int32_t> random_tokens(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> id(0, 30000);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = id(rng);
  return t;
}

TEST(PromptSimHash, SimilarPromptsAreCloseUnrelatedOnesAreNot) {
  const auto a = random_tokens(400, 1);
  auto b = a;
  for (size_t i = 0; i < b.size(); i += 50) b[i] = 7;  // a few edits
  const auto c = random_tokens(400, 2);
  EXPECT_EQ(prompt_simhash(a), prompt_simhash(a));
  EXPECT_LE(simhash_distance(prompt_simhash(a), prompt_simhash(b)), kSimilarDistance);
  EXPECT_GT(simhash_distance(prompt_simhash(a), prompt_simhash(c)), kSimilarDistance);
  EXPECT_EQ(prompt_simhash({}), 0u);
  EXPECT_NE(prompt_simhash(std::vector<int32_t>{5}), prompt_simhash(std::vector<int32_t>{6}));
}

TEST(AdmissionOrder, FcfsIsArrivalOrderWhateverElse) {
  SchedulerOptions o;
  o.length_buckets = false;
  std::vector<AdmissionCandidate> w{{LengthClass::Long, 2, 0, 0, 0},
                                    {LengthClass::Short, 3, 0, 500, 0},
                                    {LengthClass::Medium, 1, 0, 0, 0}};
  EXPECT_EQ(admission_order(w, o, {}), (std::vector<size_t>{2, 0, 1}));
}

TEST(AdmissionOrder, BucketsThenCachedPrefixThenSimilarityThenArrival) {
  SchedulerOptions o;
  const auto run = prompt_simhash(random_tokens(300, 9));
  const auto near = run ^ 0x7;  // distance 3
  const auto far = ~run;        // distance 64
  std::vector<AdmissionCandidate> w{
      {LengthClass::Long, 0, 0, 0, far},       // 0: oldest, but long
      {LengthClass::Short, 5, 0, 0, far},      // 1
      {LengthClass::Short, 6, 0, 0, near},     // 2: similar to what runs
      {LengthClass::Short, 7, 0, 64, far},     // 3: 64 tokens cached
      {LengthClass::Medium, 1, 0, 0, far},     // 4
      {LengthClass::Short, 4, 0, 0, far},      // 5: older than 1
  };
  EXPECT_EQ(admission_order(w, o, std::vector<uint64_t>{run}),
            (std::vector<size_t>{3, 2, 5, 1, 4, 0}));
  // Nothing running: no similarity preference.
  EXPECT_EQ(admission_order(w, o, {}), (std::vector<size_t>{3, 5, 1, 2, 4, 0}));
}

TEST(AdmissionOrder, StarvedRequestsGoFirstOldestFirst) {
  SchedulerOptions o;
  o.max_wait_steps = 10;
  std::vector<AdmissionCandidate> w{{LengthClass::Short, 5, 0, 100, 0},
                                    {LengthClass::Long, 3, 10, 0, 0},
                                    {LengthClass::Long, 1, 50, 0, 0},
                                    {LengthClass::Medium, 2, 9, 0, 0}};
  EXPECT_EQ(admission_order(w, o, {}), (std::vector<size_t>{2, 1, 0, 3}));
}

}  // namespace
}  // namespace fdl::engine
