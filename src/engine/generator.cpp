// Generator: owns the KV pool and the reusable scratch; each generate() call runs a
// GenerationRun over them.
#include "flashdllm/generator.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "engine/engine_context.h"
#include "engine/generation_run.h"
#include "engine/request_validation.h"

namespace fdl {
namespace {

// Default context when the caller gives none: the model's, capped so that a large model's
// KV pool (sized for max_sequences full contexts) stays reasonable.
constexpr int kDefaultContextCap = 4096;

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

size_t pool_blocks(const GeneratorOptions& o) {
  const size_t per_sequence = (size_t(o.n_ctx) + size_t(o.block_size) - 1) / size_t(o.block_size);
  // An audited sequence runs a shadow copy beside it: room for both.
  const size_t copies = o.spec.mode != SpecMode::Off && o.spec.audit_fraction > 0 ? 2 : 1;
  return per_sequence * size_t(o.max_sequences) * copies;
}

}  // namespace

struct Generator::Impl {
  Impl(Model& m, const Tokenizer& t, const GeneratorOptions& o)
      : model(m), tokenizer(t), options(resolve_options(m, o)), n_vocab(m.config().n_vocab),
        pool(m.kv_shape(options.block_size), pool_blocks(options)), kv(pool), spec(options.spec) {
    if (tokenizer.n_vocab() > n_vocab)
      throw std::invalid_argument("Generator: tokenizer has " +
                                  std::to_string(tokenizer.n_vocab()) +
                                  " tokens but the model's vocabulary is " +
                                  std::to_string(n_vocab));
    batch.tokens.reserve(size_t(options.prefill_chunk));
    batch.positions.reserve(size_t(options.prefill_chunk));
    batch.seqs.reserve(size_t(options.prefill_chunk));
    batch.want_logits.reserve(size_t(options.prefill_chunk));
    logits.reserve(size_t(options.max_sequences) * size_t(n_vocab));
  }

  Model& model;
  const Tokenizer& tokenizer;
  GeneratorOptions options;
  int32_t n_vocab;
  BlockPool pool;
  KvCache kv;
  StepBatch batch;
  std::vector<float> logits;
  GeneratorStats stats;
  engine::SpecState spec;
};

Generator::Generator(Model& model, const Tokenizer& tokenizer, const GeneratorOptions& options)
    : impl_(std::make_unique<Impl>(model, tokenizer, options)) {}
Generator::~Generator() = default;
Generator::Generator(Generator&&) noexcept = default;
Generator& Generator::operator=(Generator&&) noexcept = default;

std::vector<GenerationResult> Generator::generate(const std::vector<GenerationRequest>& requests,
                                                  const TextCallback& on_text) {
  Impl& im = *impl_;
  for (size_t i = 0; i < requests.size(); ++i)
    engine::validate_request(requests[i], i, im.n_vocab, im.options.n_ctx);
  im.stats = {};
  engine::EngineContext ctx{im.model,  im.tokenizer, im.kv,    im.options, im.n_vocab,
                            im.batch,  im.logits,    im.stats, im.spec};
  engine::GenerationRun run(ctx, requests, on_text);
  return run.run();
}

const GeneratorOptions& Generator::options() const { return impl_->options; }
const GeneratorStats& Generator::last_stats() const { return impl_->stats; }
const BlockPool& Generator::block_pool() const { return impl_->pool; }

const SpecMetrics& Generator::spec_metrics() const {
  auto& st = impl_->spec;
  st.metrics.breaker_open = st.breaker.open();
  st.metrics.breaker_trips = st.breaker.trips();
  st.metrics.breaker_reason = st.breaker.reason();
  return st.metrics;
}
void Generator::reset_spec_breaker() { impl_->spec.breaker.reset(); }
void Generator::force_audit_mismatches(int n) { impl_->spec.forced_mismatches += n; }

}  // namespace fdl
