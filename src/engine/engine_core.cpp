// EngineCore (see engine_core.h).
#include "engine/engine_core.h"

#include <stdexcept>
#include <string>

namespace fdl::engine {

EngineCore::EngineCore(Model& m, const Tokenizer& t, const GeneratorOptions& o, const char* owner)
    : model(m), tokenizer(t), options(o), n_vocab(m.config().n_vocab),
      pool(m.kv_shape(options.block_size), options.kv_blocks), kv(pool), spec(options.spec),
      tiers(make_tier_manager(m, pool, options.kv_tiers)), offload(make_offload(m, *tiers, options)) {
  // Measuring the prefill speed for the storage profile runs forwards on a pool of its own,
  // which a GPU model's arena follows: bind it to this pool again (a no-op otherwise).
  m.bind_kv_pool(pool);
  if (tokenizer.n_vocab() > n_vocab)
    throw std::invalid_argument(std::string(owner) + ": tokenizer has " +
                                std::to_string(tokenizer.n_vocab()) +
                                " tokens but the model's vocabulary is " + std::to_string(n_vocab));
  // The decode loop never reallocates its batch or logits once these have grown.
  batch.tokens.reserve(size_t(options.prefill_chunk));
  batch.positions.reserve(size_t(options.prefill_chunk));
  batch.seqs.reserve(size_t(options.prefill_chunk));
  batch.want_logits.reserve(size_t(options.prefill_chunk));
  logits.reserve(size_t(options.max_sequences) * size_t(n_vocab));
}

EngineContext EngineCore::context(bool tracing) {
  EngineContext ctx{model, tokenizer, kv,   options, n_vocab, batch, logits, stats, spec,
                    offload.get(), tracing ? &trace : nullptr};
  if (offload) offload->set_trace(ctx.trace);
  return ctx;
}

SpecMetrics EngineCore::spec_metrics() const {
  SpecMetrics m = spec.metrics;
  m.breaker_open = spec.breaker.open();
  m.breaker_trips = spec.breaker.trips();
  m.breaker_reason = spec.breaker.reason();
  return m;
}

KvTierMetrics EngineCore::tier_metrics() const {
  if (offload) return offload->metrics();
  KvTierMetrics m;
  m.placement = to_string(options.kv_tiers.placement);
  m.tiers = tiers->stats();
  return m;
}

}  // namespace fdl::engine
