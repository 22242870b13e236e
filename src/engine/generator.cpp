// Generator: owns the KV pool and the reusable scratch; each generate() call runs a
// GenerationRun over them.
#include "flashdllm/generator.h"
#include "flashdllm/engine.h"

#include <algorithm>
#include <exception>
#include <stdexcept>
#include <string>

#include "engine/engine_context.h"
#include "engine/kv_offload.h"
#include "engine/step_trace.h"
#include "engine/scheduler.h"
#include "engine/request_validation.h"
#include "engine/resolved_options.h"

namespace fdl {
namespace {

// The Generator serves a fixed list: admission order is the list order (no length
// buckets), and each forward may carry `prefill_chunk` prompt tokens besides the decodes.
SchedulerOptions scheduler_options(const GeneratorOptions& o) {
  SchedulerOptions s;
  const int window = o.spec.mode != SpecMode::Off ? o.spec.window : 0;
  s.max_num_batched_tokens = o.prefill_chunk + o.max_sequences * (2 + window);
  s.max_prefill_tokens = o.prefill_chunk;
  s.length_buckets = false;
  s.prefix_cache = true;
  return s;
}

}  // namespace

struct Generator::Impl {
  Impl(Model& m, const Tokenizer& t, const GeneratorOptions& o)
      : model(m), tokenizer(t), options(engine::resolve_options(m, o)), n_vocab(m.config().n_vocab),
        pool(m.kv_shape(options.block_size),
             engine::resolve_pool_blocks(options, options.kv_blocks, "Generator")),
        kv(pool), spec(options.spec), tiers(engine::make_tier_manager(pool, options.kv_tiers)),
        offload(engine::make_offload(m, *tiers, options)) {
    options.kv_blocks = pool.capacity();
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
  engine::StepTrace trace;
  // Declared after the pool: destroyed before it (in-flight transfers complete into it).
  std::unique_ptr<TierManager> tiers;
  std::unique_ptr<engine::KvOffload> offload;
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
  const auto start = engine::Clock::now();
  const bool tracing = !im.options.trace_file.empty();
  if (tracing) im.trace.clear();
  engine::EngineContext ctx{im.model,  im.tokenizer, im.kv,    im.options,          im.n_vocab,
                            im.batch,  im.logits,    im.stats, im.spec,             im.offload.get(),
                            tracing ? &im.trace : nullptr};
  if (im.offload) im.offload->set_trace(ctx.trace);
  // The same scheduler as the Engine's, run inline. Its prefix cache lives for this call
  // only, so the pool is back to all-free when generate() returns.
  engine::Scheduler scheduler(ctx, scheduler_options(im.options));
  std::vector<GenerationResult> results(requests.size());
  std::exception_ptr callback_error;
  for (size_t i = 0; i < requests.size(); ++i) {
    results[i].prompt_ids = requests[i].prompt_ids;
    results[i].timings.prompt_tokens = static_cast<int32_t>(requests[i].prompt_ids.size());
    GenerationResult* r = &results[i];
    scheduler.add(i, requests[i], [r, i, &on_text, &callback_error](const RequestOutput& o) {
      for (const auto& t : o.tokens) r->generated_ids.push_back(t.id);
      if (!o.text.empty()) {
        r->text.append(o.text);
        if (on_text) {
          try {
            on_text(i, o.text);
          } catch (...) {
            // The caller's callback failed (e.g. stdout is full): generate() rethrows it.
            if (!callback_error) callback_error = std::current_exception();
            throw;
          }
        }
      }
      if (o.finished) {
        r->finish_reason = o.finish_reason;
        r->matched_stop = o.matched_stop;
        r->timings = o.timings;
      }
    });
  }
  while (scheduler.has_work()) {
    scheduler.step();
    if (callback_error) std::rethrow_exception(callback_error);
  }
  im.stats.total_ms = engine::ms_between(start, engine::Clock::now());
  if (tracing) im.trace.write(im.options.trace_file);
  return results;
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
KvTierMetrics Generator::tier_metrics() const {
  const Impl& im = *impl_;
  if (im.offload) return im.offload->metrics();
  KvTierMetrics m;
  m.placement = to_string(im.options.kv_tiers.placement);
  m.tiers = im.tiers->stats();
  return m;
}

TierManager* Generator::tier_manager_for_test() { return impl_->offload ? impl_->tiers.get() : nullptr; }

void Generator::reset_spec_breaker() { impl_->spec.breaker.reset(); }
void Generator::force_audit_mismatches(int n) { impl_->spec.forced_mismatches += n; }

}  // namespace fdl
