// Generator: owns an EngineCore (KV pool, scratch, speculation and tier state); each
// generate() call runs a Scheduler over it inline.
#include "flashdllm/generator.h"
#include "flashdllm/engine.h"

#include <algorithm>
#include <exception>
#include <stdexcept>
#include <string>

#include "engine/engine_core.h"
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
  s.async_scheduling = o.async_scheduling;
  return s;
}

}  // namespace

struct Generator::Impl {
  Impl(Model& m, const Tokenizer& t, const GeneratorOptions& o)
      : core(m, t, resolved(m, o), "Generator") {}
  static GeneratorOptions resolved(Model& m, const GeneratorOptions& o) {
    GeneratorOptions r = engine::resolve_options(m, o);
    r.kv_blocks = engine::resolve_pool_blocks(r, r.kv_blocks, "Generator");
    return r;
  }
  engine::EngineCore core;
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
    engine::validate_request(requests[i], i, im.core.n_vocab, im.core.options.n_ctx);
  im.core.stats = {};
  const auto start = engine::Clock::now();
  const bool tracing = !im.core.options.trace_file.empty();
  if (tracing) im.core.trace.clear();
  engine::EngineContext ctx = im.core.context(tracing);
  // The same scheduler as the Engine's, run inline. Its prefix cache lives for this call
  // only, so the pool is back to all-free when generate() returns.
  engine::Scheduler scheduler(ctx, scheduler_options(im.core.options));
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
  im.core.stats.total_ms = engine::ms_between(start, engine::Clock::now());
  if (tracing) im.core.trace.write(im.core.options.trace_file);
  return results;
}

const GeneratorOptions& Generator::options() const { return impl_->core.options; }
const GeneratorStats& Generator::last_stats() const { return impl_->core.stats; }
const BlockPool& Generator::block_pool() const { return impl_->core.pool; }

const SpecMetrics& Generator::spec_metrics() const {
  auto& st = impl_->core.spec;
  st.metrics.breaker_open = st.breaker.open();
  st.metrics.breaker_trips = st.breaker.trips();
  st.metrics.breaker_reason = st.breaker.reason();
  return st.metrics;
}
KvTierMetrics Generator::tier_metrics() const { return impl_->core.tier_metrics(); }

TierManager* Generator::tier_manager_for_test() { return impl_->core.offload ? impl_->core.tiers.get() : nullptr; }

void Generator::reset_spec_breaker() { impl_->core.spec.breaker.reset(); }
void Generator::force_audit_mismatches(int n) { impl_->core.spec.forced_mismatches += n; }

}  // namespace fdl
