// flashdllm/speculative.h — self-verifying parallel decoding (draft-free speculation): the
// options a Generator takes and the metrics it reports. docs/SPECULATIVE.md has the design.
//
// Each step, a speculating sequence feeds [next input token, d1..dk] into the same batched
// forward as plain sequences; d1..dk come from drafters that need no second model:
//  - prompt lookup: the last n tokens (n from ngram_max down to ngram_min) matched in the
//    sequence's own prompt+output, proposing what followed (Saxena 2023, "prompt lookup");
//  - a cross-request n-gram cache fed by the outputs of every sequence;
//  - a lookahead pool (after Fu et al. 2024, "Break the Sequential Dependency of LLM
//    Inference Using Lookahead Decoding"): Jacobi guesses (the model's outputs at the
//    rejected positions of the previous step) and an n-gram pool collected from the
//    sequence's history and its verification outputs. It adds no extra forward positions.
// Acceptance keeps the output exact: greedy accepts the longest prefix equal to the argmax
// and appends the model's own token (ids identical to plain greedy); sampling uses
// speculative sampling for a point-mass draft (Leviathan et al. 2023): the output
// distribution equals plain sampling's. Several candidates are verified together as a token
// tree (SpecOptions::tree) with recursive rejection at branching nodes (Miao et al. 2024). Rejected tokens' KV is rolled back with
// KvCache::truncate.
//
// Units: windows in tokens; times in milliseconds; rates are fractions in [0, 1].
// Thread-safety: plain data; see Generator for the engine's rules.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace fdl {

/// Which drafters a Generator uses. Off = plain decoding everywhere.
enum class SpecMode : uint8_t { Off, Lookup, Lookahead, Auto };

/// "off" | "lookup" | "lookahead" | "auto"; throws std::invalid_argument otherwise.
SpecMode parse_spec_mode(std::string_view name);
const char* spec_mode_name(SpecMode mode);

struct SpecOptions {
  /// Lookup = prompt lookup + cross-request n-gram cache; Lookahead = Jacobi guesses +
  /// n-gram pool; Auto = all of them, the policy picking per step.
  SpecMode mode = SpecMode::Off;
  int window = 5;       ///< max draft tokens verified per sequence and step (k), 0..64
  int ngram_min = 1;    ///< shortest suffix matched by prompt lookup / n-gram cache, >= 1
  int ngram_max = 4;    ///< longest, ngram_min..8
  /// Choose k per sequence from its recent acceptance and the measured step cost (k = 0:
  /// plain decode). Acceptance is also learnt on plain steps, from shadow drafts: drafts
  /// that are not fed, only compared with the tokens emitted next (drafting time capped at
  /// 1% of plain step time). false = always the full window when a draft exists (tests,
  /// sweeps), no shadow drafts.
  bool adaptive = true;
  /// Tree verification (`--spec-tree on|off`): when the drafters offer several candidate
  /// continuations, verify them together as a token tree (shared prefixes once) within the
  /// same window of `window` (or the adaptive k) nodes, and accept the longest branch that
  /// matches (greedy) / by recursive rejection (sampling). Only on models whose
  /// Model::supports_tree_verification() is true (the CPU and CUDA models); elsewhere one linear
  /// draft as with false. Off by default: it measured 1-2% slower on stories260K (and
  /// -5..+9% per mode on codelm-16m; docs/BENCHMARKS.md, "Tree verification").
  bool tree = false;
  /// Fraction of greedy speculating requests that also run a plain shadow copy whose ids
  /// are compared, step by step, with XXH3 fingerprints of the accepted ids. 0 = no audit.
  double audit_fraction = 0.0;
  /// The breaker opens (speculation off for every sequence) when, over the last
  /// `breaker_window` audited steps, the mismatch rate exceeds this, or when over the last
  /// `breaker_window` speculating steps throughput is more than this fraction below the
  /// plain-decode estimate. 0..1.
  double breaker_threshold = 0.05;
  int breaker_window = 64;  ///< >= 1
  /// Throws std::invalid_argument naming the first bad field.
  void validate() const;
};

/// Totals since the Generator was built (speculation state persists across generate()).
struct SpecMetrics {
  int64_t steps = 0;            ///< decode forwards
  int64_t spec_seq_steps = 0;   ///< (sequence, step) pairs that verified >= 1 draft token
  int64_t drafted = 0;          ///< draft tokens put into forwards (shadow drafts are not)
  int64_t accepted = 0;         ///< draft tokens accepted
  int64_t rejected = 0;         ///< draft tokens rolled back (drafted - accepted, incl. those
                                ///< after an end condition)
  int64_t emitted = 0;          ///< tokens produced by decode steps
  int64_t tree_steps = 0;       ///< (sequence, step) pairs that verified a tree (>= 2 branches)
  int64_t tree_alt_accepted = 0;  ///< draft tokens accepted on a tree's non-first branches
  /// Draft tokens that spell bytes a request's grammar forces (GenerationRequest::grammar),
  /// drafted with or without speculation, and how many of them were accepted.
  int64_t forced_drafted = 0;
  int64_t forced_accepted = 0;
  int64_t audited_steps = 0;    ///< speculative steps compared against a shadow
  int64_t audit_mismatches = 0;
  bool breaker_open = false;
  int64_t breaker_trips = 0;
  std::string breaker_reason;   ///< why it last opened ("" if never)
  /// Tokens emitted per speculating (sequence, step): accepted drafts + the model's own.
  double mean_accepted_length() const {
    return spec_seq_steps > 0 ? double(accepted + spec_seq_steps) / double(spec_seq_steps) : 0.0;
  }
  /// Decode tokens produced per decode forward (1 per live sequence without speculation).
  double tokens_per_forward() const {
    return steps > 0 ? double(emitted) / double(steps) : 0.0;
  }
};

}  // namespace fdl
