// flashdllm/generator.h — the generation engine: batched prefill and decode over a Model and
// its paged KV cache, with sampling, stop strings and streaming text.
//
// One generate() call serves a list of requests with continuous batching:
//  - up to `max_sequences` requests are live at once; when one finishes, it frees its KV
//    blocks and the next waiting request is admitted;
//  - newly admitted prompts are prefilled in chunks: each forward carries up to
//    `prefill_chunk` prompt tokens (several short prompts share one forward), and only the
//    last token of each prompt asks for logits;
//  - then every live sequence advances by one token per forward (one decode step = one
//    forward over all live sequences).
// Because the model's logits for a token do not depend on what else is in the batch, a
// request's tokens are the same whether it runs alone or with others (the tests check it).
//
// Streaming: each generated token goes through a StreamingDetokenizer (whole UTF-8 only)
// and a stop-string matcher (OpenAI semantics: the stop string and what follows are not
// emitted; text that may start a stop string is held back until decided). The callback
// receives exactly the pieces whose concatenation is GenerationResult::text.
//
// Units: token counts in tokens, times in milliseconds measured with std::chrono::steady_clock.
// Errors: an invalid request (empty prompt, token id outside the vocabulary, prompt that
// leaves no room in the context, bad sampling parameters, empty stop string, max_new_tokens
// < -1) throws std::invalid_argument naming the request index, before any work is done.
// Errors from the model propagate; the KV cache is left empty either way, so the Generator
// stays usable. Reaching the context limit is not an error: the request ends with "length".
// Thread-safety: a Generator is not thread-safe; one thread calls generate() at a time. The
// callback runs on that thread, between forwards.
// The request and result types are in flashdllm/request.h, the options in
// flashdllm/options.h, the reported totals in flashdllm/metrics.h.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "flashdllm/kv_cache.h"
#include "flashdllm/kv_tiers.h"
#include "flashdllm/metrics.h"
#include "flashdllm/model.h"
#include "flashdllm/options.h"
#include "flashdllm/request.h"
#include "flashdllm/speculative.h"
#include "flashdllm/tokenizer.h"

namespace fdl {

/// Called with (request index, text piece) for every non-empty piece of generated text.
using TextCallback = std::function<void(size_t request_index, std::string_view piece)>;

class Generator {
 public:
  /// Sizes the KV pool: max_sequences * ceil(n_ctx / block_size) blocks, allocated once.
  /// `model` and `tokenizer` must outlive the Generator. Throws std::invalid_argument for
  /// bad options, or when the tokenizer's vocabulary is larger than the model's.
  Generator(Model& model, const Tokenizer& tokenizer, const GeneratorOptions& options = {});
  ~Generator();
  Generator(Generator&&) noexcept;
  Generator& operator=(Generator&&) noexcept;

  /// Runs every request to completion; results are in request order.
  std::vector<GenerationResult> generate(const std::vector<GenerationRequest>& requests,
                                         const TextCallback& on_text = {});

  /// Options with defaults resolved (n_ctx is the effective context limit).
  const GeneratorOptions& options() const;
  const GeneratorStats& last_stats() const;
  const BlockPool& block_pool() const;

  /// Speculation totals since construction (see SpecMetrics), breaker state included.
  const SpecMetrics& spec_metrics() const;
  /// Manual reset of the speculation breaker (closes it; speculation resumes next step).
  void reset_spec_breaker();
  /// Test hook: the next `n` audit comparisons count as mismatches, as if the speculative
  /// and the shadow ids had differed. Needs spec.audit_fraction > 0 to have any effect.
  void force_audit_mismatches(int n);
  /// Tier counters since construction (enabled = false when no lower tier is configured).
  KvTierMetrics tier_metrics() const;
  /// Test hook: the tier manager (nullptr without lower tiers), e.g. to corrupt a block.
  TierManager* tier_manager_for_test();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// A model and the tokenizer from its GGUF metadata. Members are destroyed tokenizer first.
struct LoadedModel {
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;
};
/// Model::load(path) + Tokenizer::from_gguf(model->gguf()). Throws what those throw.
LoadedModel load_model(const std::filesystem::path& path, const ModelOptions& options = {});

/// Prompt text -> ids as the CLI and server use them: special tokens added as the model's
/// metadata says (add_bos / add_eos); an empty result becomes [BOS], or throws
/// std::invalid_argument when the vocabulary has no BOS.
std::vector<int32_t> encode_prompt(const Tokenizer& tokenizer, std::string_view text,
                                   bool parse_special = false);

}  // namespace fdl
