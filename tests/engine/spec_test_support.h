// Helpers for the speculation tests: generators with speculation on, and the check that a
// speculative run reproduced a plain run exactly.
#pragma once

#include <gtest/gtest.h>

#include "engine_test_support.h"

namespace fdl::test {

inline GeneratorOptions spec_options(SpecMode mode, int window, bool adaptive = false,
                                     int ngram_min = 1, int ngram_max = 4) {
  GeneratorOptions o;
  o.spec.mode = mode;
  o.spec.window = window;
  o.spec.adaptive = adaptive;
  o.spec.ngram_min = ngram_min;
  o.spec.ngram_max = ngram_max;
  // These tests are about exactness: keep speculation on even where it does not pay on
  // this busy 2-core machine (the breaker has its own tests).
  o.spec.breaker_threshold = 1.0;
  return o;
}

/// Everything a caller can observe must match, not only the ids.
inline void expect_same_results(const std::vector<GenerationResult>& got,
                                const std::vector<GenerationResult>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].generated_ids, want[i].generated_ids) << "request " << i;
    EXPECT_EQ(got[i].text, want[i].text) << "request " << i;
    EXPECT_EQ(got[i].finish_reason, want[i].finish_reason) << "request " << i;
    EXPECT_EQ(got[i].matched_stop, want[i].matched_stop) << "request " << i;
    EXPECT_EQ(got[i].timings.gen_tokens, want[i].timings.gen_tokens) << "request " << i;
  }
}

/// Greedy requests for every case of a reference file of ../shared/reference/.
inline std::vector<GenerationRequest> reference_requests(const std::string& file) {
  std::vector<GenerationRequest> reqs;
  for (const auto& c : read_reference(file))
    reqs.push_back(greedy_request(c["prompt_token_ids"].get<std::vector<int32_t>>(), c["n_predict"].get<int>()));
  return reqs;
}

inline void expect_pool_full(const Generator& gen) {
  EXPECT_EQ(gen.block_pool().n_free(), gen.block_pool().capacity());
}

}  // namespace fdl::test
