// Option resolution shared by Generator and Engine (see resolved_options.h).
#include "engine/resolved_options.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace fdl::engine {

GeneratorOptions resolve_options(const Model& model, GeneratorOptions o) {
  const int n_ctx_train = model.config().n_ctx_train;
  if (o.block_size < 1)
    throw std::invalid_argument("Generator: block_size must be >= 1, got " +
                                std::to_string(o.block_size));
  if (o.max_sequences < 1)
    throw std::invalid_argument("Generator: max_sequences must be >= 1, got " +
                                std::to_string(o.max_sequences));
  if (o.prefill_chunk < 1)
    throw std::invalid_argument("Generator: prefill_chunk must be >= 1, got " +
                                std::to_string(o.prefill_chunk));
  if (o.n_ctx < 0)
    throw std::invalid_argument("Generator: n_ctx must be >= 0 (0 = model default), got " +
                                std::to_string(o.n_ctx));
  if (o.n_ctx == 0) o.n_ctx = n_ctx_train > 0 ? std::min(n_ctx_train, kDefaultContextCap)
                                              : kDefaultContextCap;
  if (n_ctx_train > 0 && o.n_ctx > n_ctx_train)
    throw std::invalid_argument("Generator: n_ctx = " + std::to_string(o.n_ctx) +
                                " exceeds the model's training context of " +
                                std::to_string(n_ctx_train) + " tokens");
  o.spec.validate();
  if (o.n_ctx < 2)
    throw std::invalid_argument("Generator: n_ctx must be >= 2 (a prompt token and a new one)");
  return o;
}

size_t default_pool_blocks(const GeneratorOptions& o) {
  const size_t per_sequence = (size_t(o.n_ctx) + size_t(o.block_size) - 1) / size_t(o.block_size);
  // An audited sequence runs a shadow copy beside it: room for both.
  const size_t copies = o.spec.mode != SpecMode::Off && o.spec.audit_fraction > 0 ? 2 : 1;
  return per_sequence * size_t(o.max_sequences) * copies;
}

size_t resolve_pool_blocks(const GeneratorOptions& o, size_t requested, const char* who) {
  const size_t per_sequence = (size_t(o.n_ctx) + size_t(o.block_size) - 1) / size_t(o.block_size);
  const size_t blocks = requested == 0 ? default_pool_blocks(o) : requested;
  // One request may always run alone: it needs a full context (plus a shadow copy when
  // audited, which the scheduler drops first under pressure).
  if (blocks < per_sequence)
    throw std::invalid_argument(std::string(who) + ": a KV pool of " + std::to_string(blocks) +
                                " blocks (kv_blocks) cannot hold one full context (" + std::to_string(per_sequence) +
                                " blocks of " + std::to_string(o.block_size) + " tokens for n_ctx " +
                                std::to_string(o.n_ctx) + ")");
  return blocks;
}

void validate_scheduler_options(const SchedulerOptions& s, const GeneratorOptions& g) {
  auto positive = [](int v, const char* name) {
    if (v < 1)
      throw std::invalid_argument(std::string("scheduler: ") + name + " must be >= 1, got " +
                                  std::to_string(v));
  };
  positive(s.max_num_batched_tokens, "max_num_batched_tokens");
  positive(s.short_prompt_tokens, "short_prompt_tokens");
  positive(s.long_prompt_tokens, "long_prompt_tokens");
  positive(s.long_prefill_chunk, "long_prefill_chunk");
  positive(s.max_wait_steps, "max_wait_steps");
  if (s.max_prefill_tokens < 0)
    throw std::invalid_argument("scheduler: max_prefill_tokens must be >= 0 (0 = no cap), got " +
                                std::to_string(s.max_prefill_tokens));
  if (s.max_num_batched_tokens < g.max_sequences)
    throw std::invalid_argument("scheduler: max_num_batched_tokens (" +
                                std::to_string(s.max_num_batched_tokens) +
                                ") must be >= max_num_seqs (" + std::to_string(g.max_sequences) +
                                "): every running sequence decodes one token per step");
  if (s.short_prompt_tokens > s.long_prompt_tokens)
    throw std::invalid_argument("scheduler: short_prompt_tokens (" +
                                std::to_string(s.short_prompt_tokens) +
                                ") must not exceed long_prompt_tokens (" +
                                std::to_string(s.long_prompt_tokens) + ")");
}

}  // namespace fdl::engine
