// Shared helpers for the engine tests: the test models (loaded once per binary), reference
// files, and request builders.
#pragma once

#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "flashdllm/generator.h"
#include "test_support.h"

namespace fdl::test {

// One compute thread: these models are tiny, results do not depend on the thread count,
// and spinning workers on a shared, busy machine only make the tests slower.
inline const ModelOptions kTestModelOptions{.n_threads = 1};

inline const LoadedModel& stories_model() {
  static const LoadedModel m = load_model(model_path("stories260K.gguf"), kTestModelOptions);
  return m;
}
inline const LoadedModel& codelm_model() {
  static const LoadedModel m = load_model(model_path("codelm-16m-f16.gguf"), kTestModelOptions);
  return m;
}

inline Generator make_generator(const LoadedModel& m, GeneratorOptions options = {}) {
  return Generator(*m.model, *m.tokenizer, options);
}

inline nlohmann::json read_reference(const std::string& file) {
  std::ifstream in(reference_path(file));
  if (!in) throw std::runtime_error("cannot open reference " + reference_path(file).string());
  return nlohmann::json::parse(in);
}

inline GenerationRequest greedy_request(std::vector<int32_t> prompt, int max_new_tokens,
                                        bool ignore_eos = true) {
  GenerationRequest r;
  r.prompt_ids = std::move(prompt);
  r.sampling.temperature = 0.f;
  r.max_new_tokens = max_new_tokens;
  r.ignore_eos = ignore_eos;
  return r;
}

inline GenerationRequest sampled_request(std::vector<int32_t> prompt, int max_new_tokens,
                                         uint64_t seed) {
  GenerationRequest r;
  r.prompt_ids = std::move(prompt);
  r.sampling.temperature = 0.9f;
  r.sampling.top_k = 40;
  r.sampling.top_p = 0.95f;
  r.sampling.seed = seed;
  r.max_new_tokens = max_new_tokens;
  r.ignore_eos = true;
  return r;
}

/// Counts non-overlapping occurrences of `needle` in `haystack`.
inline size_t count_occurrences(const std::string& haystack, const std::string& needle) {
  size_t n = 0;
  for (size_t at = haystack.find(needle); at != std::string::npos;
       at = haystack.find(needle, at + needle.size()))
    ++n;
  return n;
}

}  // namespace fdl::test
