// Internal: turns a step's sampled tokens into what a request's caller sees — end conditions,
// streaming text through the detokenizer and the stop matcher, log-probabilities, timings and
// deliveries to the request's sink (the "output" of plan → run → output).
//
// Log-probabilities are the model's raw log-softmax (vLLM's default "raw_logprobs"): the
// distribution before penalties, temperature and truncation, so greedy requests get
// meaningful alternatives too.
// A request ends ("stop": an end-of-generation token or a stop string; "length":
// max_new_tokens or the context; "abort"; "error") through finish(), which releases its KV
// through the scheduler's `release_kv` right away (the rest of the step must not feed it);
// an error-ended sequence's KV is not cached (its failed step may not have computed it).
// Thread-safety: none (the scheduler's thread). Sinks run inside deliver().
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/live_sequence.h"

namespace fdl::engine {

struct SchedulerCounters;

class OutputProcessor {
 public:
  /// Frees a finished sequence's KV; `cache`: its fed full blocks go into the prefix cache.
  using ReleaseKv = std::function<void(LiveSequence&, bool cache)>;

  OutputProcessor(const Tokenizer& tokenizer, size_t n_ctx, SchedulerCounters& counters, ReleaseKv release_kv)
      : tokenizer_(tokenizer), n_ctx_(n_ctx), counters_(counters), release_kv_(std::move(release_kv)) {}

  /// `s` sampled `token`; `logits` is its row (empty in an ids-only step: no logprobs then).
  /// Appends the token to the context, the sampler's penalty window and the pending output,
  /// and ends the request when an end condition holds.
  void on_token(LiveSequence& s, int32_t token, std::span<const float> logits);
  /// Ends `s` with `reason` ("stop", "length", "abort", "error" with `error` as message):
  /// flushes held text (a held tail may still complete a stop string, which then makes the
  /// reason "stop"), fills the final output and releases the KV.
  void finish(LiveSequence& s, const char* reason, const std::string& error = {});
  /// Hands `s`'s pending output to its sink and clears it. A sink that throws ends its
  /// request ("abort"): it gets one final delivery and is not called again.
  void deliver(LiveSequence& s);
  /// Delivers every sequence of `seqs` that finished or has pending tokens or text.
  void deliver_ready(const std::vector<std::unique_ptr<LiveSequence>>& seqs);

  /// The ids on_token saw since clear_sampled(), in order (a speculative step's audit
  /// fingerprint covers what it sampled).
  const std::vector<int32_t>& sampled() const { return sampled_; }
  void clear_sampled() { sampled_.clear(); }

 private:
  std::string detokenize(LiveSequence& s, int32_t token);
  static void emit(LiveSequence& s, std::string_view piece) {
    if (!piece.empty()) s.pending.text.append(piece);
  }

  const Tokenizer& tokenizer_;
  size_t n_ctx_;
  SchedulerCounters& counters_;
  ReleaseKv release_kv_;
  std::vector<int32_t> sampled_;
};

}  // namespace fdl::engine
