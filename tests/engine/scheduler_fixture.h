// A Scheduler over a real model with every step under the test's control (the Engine runs the
// same scheduler on its own thread, which makes step-level orderings nondeterministic).
#pragma once

#include <map>
#include <memory>

#include "engine/engine_context.h"
#include "engine/resolved_options.h"
#include "engine/scheduler.h"
#include "engine_test_support.h"

namespace fdl::test {

struct SchedulerFixture {
  SchedulerFixture(const LoadedModel& m, GeneratorOptions g, SchedulerOptions s,
                   size_t kv_blocks = 0)
      : SchedulerFixture(*m.model, *m.tokenizer, g, s, kv_blocks) {}
  /// Over any model (a wrapper around a loaded one, say).
  SchedulerFixture(Model& m, const Tokenizer& t, GeneratorOptions g, SchedulerOptions s, size_t kv_blocks = 0)
      : model(m), tokenizer(t), options(engine::resolve_options(model, g)),
        pool(model.kv_shape(options.block_size),
             kv_blocks ? kv_blocks : engine::default_pool_blocks(options)),
        kv(pool), spec(options.spec),
        ctx{model, tokenizer, kv, options, model.config().n_vocab, batch, logits, stats, spec},
        scheduler(ctx, s) {
    engine::validate_scheduler_options(s, options);
  }

  struct Record {
    std::vector<int32_t> ids;
    std::string text;
    std::string finish_reason;
    int64_t first_token_step = -1;  ///< scheduler step that produced the first token
    int32_t cached_prompt_tokens = 0;
    bool finished = false;
  };

  void add(RequestId id, GenerationRequest r) {
    scheduler.add(id, std::move(r), [this, id](const RequestOutput& o) {
      Record& rec = records[id];
      if (rec.first_token_step < 0 && !o.tokens.empty())
        rec.first_token_step = scheduler.counters().steps;
      for (const auto& t : o.tokens) rec.ids.push_back(t.id);
      rec.text += o.text;
      if (o.finished) {
        rec.finished = true;
        rec.finish_reason = o.finish_reason;
        rec.cached_prompt_tokens = o.cached_prompt_tokens;
      }
    });
  }
  void run() {
    while (scheduler.has_work()) scheduler.step();
  }

  Model& model;
  const Tokenizer& tokenizer;
  GeneratorOptions options;
  BlockPool pool;
  KvCache kv;
  StepBatch batch;
  std::vector<float> logits;
  GeneratorStats stats;
  engine::SpecState spec;
  engine::EngineContext ctx;
  engine::Scheduler scheduler;
  std::map<RequestId, Record> records;
};

}  // namespace fdl::test
