// OutputProcessor: per-token bookkeeping (design in output_processor.h).
#include "engine/output_processor.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "engine/scheduler_counters.h"

namespace fdl::engine {
namespace {

// Log-softmax of one row at the ids asked for: logprob of `token` and the `top_n` most
// likely ids (descending, lower id first on ties). The row is the model's raw logits (vLLM's
// default, "raw_logprobs": the distribution before penalties, temperature and truncation),
// so greedy requests get meaningful alternatives too.
SampledToken with_logprobs(int32_t token, std::span<const float> row, int32_t top_n) {
  float max_logit = -std::numeric_limits<float>::infinity();
  for (float v : row) max_logit = std::max(max_logit, v);
  double sum = 0.0;
  for (float v : row) sum += std::exp(double(v) - double(max_logit));
  const double log_z = double(max_logit) + std::log(sum);
  SampledToken out;
  out.id = token;
  out.logprob = float(double(row[size_t(token)]) - log_z);
  if (top_n > 0) {
    std::vector<int32_t> ids(row.size());
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i);
    const size_t n = std::min(size_t(top_n), ids.size());
    std::partial_sort(ids.begin(), ids.begin() + std::ptrdiff_t(n), ids.end(),
                      [&](int32_t a, int32_t b) {
                        return row[size_t(a)] != row[size_t(b)] ? row[size_t(a)] > row[size_t(b)]
                                                                : a < b;
                      });
    out.top.reserve(n);
    for (size_t i = 0; i < n; ++i)
      out.top.push_back({ids[i], float(double(row[size_t(ids[i])]) - log_z)});
  }
  return out;
}

}  // namespace

std::string OutputProcessor::detokenize(LiveSequence& s, int32_t token) {
  // A model vocabulary may be padded past the tokenizer's; such ids have no text.
  if (token >= tokenizer_.n_vocab()) return {};
  return s.detokenizer.push(token);
}

void OutputProcessor::on_token(LiveSequence& s, int32_t token, std::span<const float> logits) {
  const auto now = Clock::now();
  auto& timings = s.timings;
  if (timings.gen_tokens == 0) {
    timings.ttft_ms = ms_between(s.submitted_at, now);
    s.first_token_at = now;
  } else {
    timings.token_latencies_ms.push_back(ms_between(s.last_token_at, now));
  }
  s.last_token_at = now;
  ++timings.gen_tokens;
  ++s.n_sampled;
  ++counters_.generated;
  sampled_.push_back(token);  // the speculative step's fingerprint covers what was sampled

  const bool end_of_generation =
      token < tokenizer_.n_vocab() && tokenizer_.is_eog(token);
  // A grammar allows end-of-generation only where its text is complete: there it ends the
  // request even with ignore_eos (going on would leave the grammar).
  if (end_of_generation && (!s.request.ignore_eos || s.grammar)) {
    finish(s, "stop");
    return;
  }
  if (s.request.logprobs >= 0) {
    // The model's own distribution (vLLM's default "raw_logprobs"): penalties, temperature
    // and truncation shape the draw, not the reported probabilities.
    s.pending.tokens.push_back(with_logprobs(token, logits, s.request.logprobs));
  } else {
    SampledToken t;
    t.id = token;
    t.logprob = std::numeric_limits<float>::quiet_NaN();
    s.pending.tokens.push_back(std::move(t));
  }
  ++s.n_generated;
  s.context.push_back(token);
  s.sampler.accept(token);
  emit(s, s.stop.push(detokenize(s, token)));
  if (s.stop.stopped()) {
    finish(s, "stop");
    return;
  }
  const bool hit_max = s.request.max_new_tokens > 0 &&
                       s.n_generated >= size_t(s.request.max_new_tokens);
  // The next decode step would store this token at position prompt + n_generated - 1;
  // stopping when prompt + generated reaches n_ctx keeps every sequence within n_ctx.
  const bool context_full =
      s.request.prompt_ids.size() + s.n_generated >= n_ctx_;
  if (hit_max || context_full) {
    finish(s, "length");
    return;
  }
  s.last_token = token;
}

void OutputProcessor::finish(LiveSequence& s, const char* reason, const std::string& error) {
  const std::string why = reason;
  if (why == "stop" || why == "length") {
    if (!s.stop.stopped()) {
      // Release what the detokenizer and the matcher still hold; the held tail may yet
      // complete a stop string, which then decides the reason.
      emit(s, s.stop.push(s.detokenizer.flush()));
      emit(s, s.stop.flush());
    }
    if (s.stop.stopped()) {
      reason = "stop";
      s.pending.matched_stop = s.request.stop[size_t(s.stop.matched_index())];
    }
  }
  s.timings.decode_ms = s.timings.gen_tokens > 0 ? ms_between(s.first_token_at, s.last_token_at)
                                                 : 0.0;
  s.finished = true;
  // A sequence that ends with an error may hold KV its failed step never computed: none of
  // it goes into the prefix cache.
  release_kv_(s, why != "error");
  RequestOutput& out = s.pending;
  out.finished = true;
  out.finish_reason = reason;
  out.error = error;
  out.prompt_tokens = static_cast<int32_t>(s.request.prompt_ids.size());
  out.completion_tokens = static_cast<int32_t>(s.n_generated);
  out.cached_prompt_tokens = s.cached_prompt_tokens;
  out.queue_ms = s.admitted_once ? ms_between(s.submitted_at, s.admitted_at) : 0.0;
  out.timings = s.timings;
  ++counters_.finished;
  if (out.finish_reason == "abort") ++counters_.aborted;
  if (out.finish_reason == "error") ++counters_.failed;
}

void OutputProcessor::deliver(LiveSequence& s) {
  if (s.sink) {
    try {
      s.sink(s.pending);
    } catch (...) {
      // A sink that cannot take output ends its request: it gets one final delivery (its
      // owner may be counting requests) and is not called again.
      OutputSink sink = std::move(s.sink);
      s.sink = nullptr;
      if (!s.finished) {
        s.pending.tokens.clear();
        s.pending.text.clear();
        finish(s, "abort");
        try {
          sink(s.pending);
        } catch (...) {
        }
      }
    }
  }
  const bool finished = s.pending.finished;
  s.pending.tokens.clear();
  s.pending.text.clear();
  if (finished) s.pending.finished = true;
}

void OutputProcessor::deliver_ready(const std::vector<std::unique_ptr<LiveSequence>>& seqs) {
  for (const auto& s : seqs)
    if (s->finished || !s->pending.tokens.empty() || !s->pending.text.empty()) deliver(*s);
}

}  // namespace fdl::engine
