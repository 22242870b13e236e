// Internal: the state of one request from submission to its final delivery.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

#include "decode/lookahead_pool.h"
#include "decode/stop_matcher.h"
#include "decode/window_controller.h"
#include "engine/grammar_state.h"
#include "flashdllm/kv_cache.h"
#include "flashdllm/request.h"
#include "flashdllm/sampling.h"
#include "flashdllm/tokenizer.h"

namespace fdl::engine {

using Clock = std::chrono::steady_clock;

inline double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

/// The plain-decoding shadow copy of an audited sequence (see shadow_audit.cpp).
struct ShadowCopy {
  explicit ShadowCopy(const Sampler& s) : sampler(s) {}
  SeqId seq = -1;
  Sampler sampler;          ///< a copy of the audited sequence's sampler at the fork
  int32_t last_token = -1;  ///< to feed next
  size_t base = 0;          ///< sampled-token index of the first id in `ids`
  std::vector<int32_t> ids; ///< tokens the shadow sampled, in order
  std::vector<int32_t> logits_q;  ///< quantize_logit of each, for the fingerprint
  struct Pending { size_t begin, end; uint64_t fingerprint; };
  std::deque<Pending> pending;  ///< speculative steps awaiting comparison
};

/// Length class of a prompt for the length-bucket admission (SchedulerOptions).
enum class LengthClass { Short = 0, Medium = 1, Long = 2 };

struct LiveSequence {
  LiveSequence(RequestId rid, GenerationRequest req, OutputSink out, int32_t n_vocab,
               const Tokenizer& tokenizer, Clock::time_point now)
      : id(rid), request(std::move(req)), sink(std::move(out)),
        sampler(request.sampling, n_vocab),
        detokenizer(tokenizer, /*render_special=*/!request.skip_special_tokens, /*continues_text=*/true),
        stop(request.stop), context(request.prompt_ids) {
    pending.id = rid;
    submitted_at = now;
  }

  RequestId id;
  GenerationRequest request;
  OutputSink sink;
  RequestOutput pending;       ///< what the next delivery carries
  SeqId seq = -1;              ///< KV sequence while admitted; -1 when waiting or done
  size_t n_prefilled = 0;      ///< context tokens in the KV cache (prefill progress)
  int32_t last_token = -1;     ///< sampled but not yet fed to the model (-1 before the first)
  bool finished = false;
  LengthClass length_class = LengthClass::Short;
  uint64_t arrival = 0;        ///< submission order
  uint64_t simhash = 0;        ///< prompt_simhash of the prompt (admission grouping)
  int64_t waited_steps = 0;    ///< steps spent waiting for admission (anti-starvation)
  /// Times admission passed it over, a slot free, because its cached prefix was still in a
  /// lower tier (device copies): bounded, so that it is admitted in the end even if its
  /// prefetch never finds room.
  int tier_deferrals = 0;
  bool admitted_once = false;
  size_t n_recompute = 0;      ///< context tokens to prefill again after a preemption
  Sampler sampler;
  /// Generated text continues the prompt, so its first piece keeps its leading space.
  StreamingDetokenizer detokenizer;
  StopMatcher stop;
  size_t n_generated = 0;      ///< generated ids kept (an end-of-generation stopper excluded)
  int32_t cached_prompt_tokens = 0;
  GenerationTimings timings;
  Clock::time_point submitted_at;
  Clock::time_point admitted_at{};
  Clock::time_point prefill_start{};
  Clock::time_point first_token_at{};
  Clock::time_point last_token_at{};

  // Speculation
  std::vector<int32_t> context;  ///< prompt + kept generated ids (drafters read it)
  size_t n_sampled = 0;          ///< tokens sampled, a stopping end-of-generation included
  int spec_window = 0;           ///< max draft tokens per step for this request (0 = plain)
  spec::LookaheadPool lookahead;
  size_t lookahead_fed = 1;      ///< context[..lookahead_fed) is in the pool's history
  spec::WindowController window;
  // Tree verification: collecting alternates costs 10-20 µs on a long context (a whole
  // backwards scan per n-gram size, several drafters), a visible share of a tiny model's
  // ~50 µs step, and mostly finds none; after a fruitless collection the next `tree_skip`
  // drafts skip it, the gap doubling (up to kMaxTreeBackoff) while none is found. (At 16,
  // stories260K ran 1-2% slower with trees on than off.)
  int tree_skip = 0;
  int tree_backoff = 0;
  static constexpr int kMaxTreeBackoff = 64;
  std::optional<ShadowCopy> shadow;
  /// Set when the request has a grammar: every sampled token is masked by it.
  std::optional<GrammarState> grammar;
  /// This step's draft: how many of its tokens came from the drafters (the rest the grammar
  /// forced).
  size_t draft_kept = 0;

  /// Context tokens that must be in the KV cache before decoding: the whole prompt for a
  /// new request; after a preemption, everything but the last sampled token (fed by decode).
  size_t prefill_target() const { return last_token >= 0 ? context.size() - 1 : context.size(); }
  bool prefilling() const { return n_prefilled < prefill_target(); }
};

}  // namespace fdl::engine
