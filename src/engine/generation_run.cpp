// The generation loop (see flashdllm/generator.h for the scheduling it implements).
#include "engine/generation_run.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace fdl::engine {

GenerationRun::GenerationRun(EngineContext& ctx, const std::vector<GenerationRequest>& requests,
                             const TextCallback& on_text)
    : ctx_(ctx), requests_(requests), on_text_(on_text), results_(requests.size()),
      start_(Clock::now()), policy_(ctx.spec.options, ctx.spec.cache) {
  for (size_t i = 0; i < requests.size(); ++i) {
    results_[i].prompt_ids = requests[i].prompt_ids;
    results_[i].timings.prompt_tokens = static_cast<int32_t>(requests[i].prompt_ids.size());
  }
  live_.reserve(size_t(ctx.options.max_sequences));
}

GenerationRun::~GenerationRun() {
  for (auto& s : live_) {
    if (s->seq >= 0) ctx_.kv.free_sequence(s->seq);
    end_shadow(*s);
  }
}

std::vector<GenerationResult> GenerationRun::run() {
  while (next_request_ < requests_.size() || !live_.empty()) {
    const auto fresh = admit();
    if (!fresh.empty()) prefill(fresh);
    drop_finished();
    if (!live_.empty()) decode_step();
    drop_finished();
  }
  ctx_.stats.total_ms = ms_between(start_, Clock::now());
  return std::move(results_);
}

std::vector<LiveSequence*> GenerationRun::admit() {
  std::vector<LiveSequence*> fresh;
  while (next_request_ < requests_.size() &&
         live_.size() < size_t(ctx_.options.max_sequences)) {
    const size_t index = next_request_++;
    const auto& request = requests_[index];
    if (request.max_new_tokens == 0) {
      results_[index].finish_reason = "length";
      continue;
    }
    auto s = std::make_unique<LiveSequence>(index, request, results_[index], ctx_.n_vocab,
                                            ctx_.tokenizer);
    // The penalties see the prompt too, as in llama.cpp.
    if (request.sampling.has_penalties())
      for (int32_t t : request.prompt_ids) s->sampler.accept(t);
    // Reserve the outputs up front so the decode loop does not reallocate them.
    const size_t room = size_t(ctx_.options.n_ctx) - request.prompt_ids.size();
    const size_t expected = request.max_new_tokens > 0
                                ? std::min(room, size_t(request.max_new_tokens)) : room;
    s->result.generated_ids.reserve(expected);
    s->result.timings.token_latencies_ms.reserve(expected);
    s->spec_window = ctx_.spec.enabled()
                         ? (request.spec_window >= 0 ? request.spec_window
                                                     : ctx_.spec.options.window)
                         : 0;
    s->seq = ctx_.kv.create_sequence();
    fresh.push_back(s.get());
    live_.push_back(std::move(s));
  }
  return fresh;
}

void GenerationRun::forward(size_t logit_rows) {
  const auto t0 = Clock::now();
  ctx_.model.forward(ctx_.batch, ctx_.kv, ctx_.logits);
  ctx_.stats.forward_ms += ms_between(t0, Clock::now());
  ++ctx_.stats.n_forwards;
  // Reading rows that are not there would be undefined behaviour; fail loudly instead.
  if (ctx_.logits.size() != logit_rows * size_t(ctx_.n_vocab))
    throw std::logic_error("Model::forward returned " + std::to_string(ctx_.logits.size()) +
                           " logits, expected " + std::to_string(logit_rows) + " rows of " +
                           std::to_string(ctx_.n_vocab));
}

std::span<const float> GenerationRun::logits_row(size_t row) const {
  return {ctx_.logits.data() + row * size_t(ctx_.n_vocab), size_t(ctx_.n_vocab)};
}

void GenerationRun::prefill(const std::vector<LiveSequence*>& fresh) {
  const size_t chunk = size_t(ctx_.options.prefill_chunk);
  std::vector<LiveSequence*> completing;
  size_t first_pending = 0;
  while (first_pending < fresh.size()) {
    // Pack prompt tokens, in admission order, until the chunk is full.
    ctx_.batch.clear();
    completing.clear();
    const auto batch_start = Clock::now();
    size_t budget = chunk;
    for (size_t i = first_pending; i < fresh.size() && budget > 0; ++i) {
      LiveSequence& s = *fresh[i];
      const auto& prompt = s.request.prompt_ids;
      const size_t take = std::min(prompt.size() - s.n_prefilled, budget);
      const size_t pos0 = ctx_.kv.append_slots(s.seq, take);
      if (s.n_prefilled == 0) s.prefill_start = batch_start;
      for (size_t k = 0; k < take; ++k) {
        const size_t idx = s.n_prefilled + k;
        ctx_.batch.add(prompt[idx], static_cast<int32_t>(pos0 + k), s.seq,
                       idx + 1 == prompt.size());
      }
      s.n_prefilled += take;
      budget -= take;
      if (s.n_prefilled == prompt.size()) completing.push_back(&s);
    }
    ctx_.stats.n_prefill_tokens += static_cast<int64_t>(ctx_.batch.size());
    forward(completing.size());
    const auto batch_end = Clock::now();
    // A prefill forward is a free calibration point for the speculation cost model: many
    // tokens in one forward show what one more token costs before any draft is tried. Not
    // the Generator's very first forward: it pages the weights in and is no measure.
    if (ctx_.spec.enabled() && ctx_.spec.cost.has_data())
      ctx_.spec.cost.observe(double(ctx_.batch.size()), ms_between(batch_start, batch_end));
    // Logit rows come in batch order, which is `completing` order.
    for (size_t row = 0; row < completing.size(); ++row) {
      LiveSequence& s = *completing[row];
      s.result.timings.prompt_ms = ms_between(s.prefill_start, batch_end);
      on_token(s, s.sampler.sample(logits_row(row)));
      if (!s.finished) start_shadow(s);
    }
    while (first_pending < fresh.size() &&
           fresh[first_pending]->n_prefilled == fresh[first_pending]->request.prompt_ids.size())
      ++first_pending;
  }
}

std::string GenerationRun::detokenize(LiveSequence& s, int32_t token) {
  // A model vocabulary may be padded past the tokenizer's; such ids have no text.
  if (token >= ctx_.tokenizer.n_vocab()) return {};
  return s.detokenizer.push(token);
}

void GenerationRun::on_token(LiveSequence& s, int32_t token) {
  const auto now = Clock::now();
  auto& timings = s.result.timings;
  if (timings.gen_tokens == 0) {
    timings.ttft_ms = ms_between(start_, now);
    s.first_token_at = now;
  } else {
    timings.token_latencies_ms.push_back(ms_between(s.last_token_at, now));
  }
  s.last_token_at = now;
  ++timings.gen_tokens;
  ++s.n_sampled;
  emitted_.push_back(token);  // the speculative step's fingerprint covers what was sampled

  const bool end_of_generation =
      token < ctx_.tokenizer.n_vocab() && ctx_.tokenizer.is_eog(token);
  if (end_of_generation && !s.request.ignore_eos) {
    finish(s, "stop");
    return;
  }
  s.result.generated_ids.push_back(token);
  s.context.push_back(token);
  s.sampler.accept(token);
  emit(s, s.stop.push(detokenize(s, token)));
  if (s.stop.stopped()) {
    finish(s, "stop");
    return;
  }
  const size_t n_generated = s.result.generated_ids.size();
  const bool hit_max = s.request.max_new_tokens > 0 &&
                       n_generated >= size_t(s.request.max_new_tokens);
  // The next decode step would store this token at position prompt + n_generated - 1;
  // stopping when prompt + generated reaches n_ctx keeps every sequence within n_ctx.
  const bool context_full =
      s.request.prompt_ids.size() + n_generated >= size_t(ctx_.options.n_ctx);
  if (hit_max || context_full) {
    finish(s, "length");
    return;
  }
  s.last_token = token;
}

void GenerationRun::finish(LiveSequence& s, const char* reason) {
  if (!s.stop.stopped()) {
    // Release what the detokenizer and the matcher still hold; the held tail may yet
    // complete a stop string, which then decides the reason.
    emit(s, s.stop.push(s.detokenizer.flush()));
    emit(s, s.stop.flush());
  }
  if (s.stop.stopped()) {
    reason = "stop";
    s.result.matched_stop = s.request.stop[size_t(s.stop.matched_index())];
  }
  s.result.finish_reason = reason;
  s.result.timings.decode_ms = ms_between(s.first_token_at, s.last_token_at);
  s.finished = true;
  ctx_.kv.free_sequence(s.seq);
  s.seq = -1;
  end_shadow(s);
}

void GenerationRun::emit(LiveSequence& s, std::string_view piece) {
  if (piece.empty()) return;
  s.result.text.append(piece);
  if (on_text_) on_text_(s.request_index, piece);
}

void GenerationRun::drop_finished() {
  std::erase_if(live_, [](const std::unique_ptr<LiveSequence>& s) { return s->finished; });
}

}  // namespace fdl::engine
