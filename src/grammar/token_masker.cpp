#include "grammar/token_masker.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace fdl::grammar {
namespace {

// Bounds on what one grammar's caches may hold before they start over (checked between
// masks), and hard bounds a single mask computation may not pass (it fails instead).
constexpr size_t kMaxFrames = size_t(1) << 20;
constexpr size_t kMaxSets = size_t(1) << 15;
constexpr size_t kMaxMaskBytes = size_t(128) << 20;
constexpr size_t kHardMaxFrames = 4 * kMaxFrames;
constexpr size_t kHardMaxSets = 4 * kMaxSets;
// Rule visits one mask computation may make: a walk of a 128k vocabulary in a JSON string
// makes about a million; a grammar that needs far more is refused rather than stall the
// engine thread.
constexpr size_t kMaskWorkBudget = size_t(1) << 24;
// As the matcher's bounds, so the masks never allow what the matcher refuses on that account.
constexpr size_t kMaxFramesPerSet = GrammarMatcher::kMaxStacks;
constexpr size_t kMaxDepth = GrammarMatcher::kMaxStackDepth;
constexpr size_t kMaxForcedBytes = 256;

[[noreturn]] void too_costly() {
  throw GrammarError("", "the grammar takes too much work to match over the model's vocabulary "
                         "(more than 16M rule visits or 4M parse frames for one token mask)");
}

}  // namespace

TokenMasker::TokenMasker(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenTrie> trie)
    : grammar_(std::move(grammar)), trie_(std::move(trie)) {}

uint32_t TokenMasker::intern_frame(uint32_t pos, uint32_t parent) {
  const uint64_t key = (uint64_t(pos) << 32) | parent;
  const auto [it, inserted] = frame_ids_.try_emplace(key, uint32_t(frames_.size()));
  if (inserted) {
    if (frames_.size() >= kHardMaxFrames) too_costly();
    frames_.push_back({pos, parent, parent == kEmptyStack ? 1u : frames_[parent].depth + 1});
  }
  return it->second;
}

void TokenMasker::expand(uint32_t f, std::vector<uint32_t>& out) {
  using Kind = Grammar::Element::Kind;
  const auto& el = grammar_->elements();
  work_.clear();
  work_.push_back(f);
  while (!work_.empty()) {
    uint32_t cur = work_.back();
    work_.pop_back();
    for (;;) {
      if (cur == kEmptyStack || el[frames_[cur].pos].kind == Kind::Bytes) {
        out.push_back(cur);
        break;
      }
      const Frame fr = frames_[cur];
      if (el[fr.pos].kind == Kind::End) {
        cur = fr.parent;
        continue;
      }
      if (out.size() + work_.size() > kMaxFramesPerSet || fr.depth > kMaxDepth) break;
      if (work_left_ == 0) too_costly();
      --work_left_;
      // As GrammarMatcher::expand: the continuation (dropped when it is an end), then each
      // alternative on top of it.
      const uint32_t base = el[fr.pos + 1].kind == Kind::End ? fr.parent : intern_frame(fr.pos + 1, fr.parent);
      const auto& alts = grammar_->alternatives(el[fr.pos].value);
      for (size_t i = 1; i < alts.size(); ++i) work_.push_back(intern_frame(alts[i], base));
      cur = intern_frame(alts[0], base);
    }
  }
}

uint32_t TokenMasker::intern_set(std::vector<uint32_t>& frames) {
  std::sort(frames.begin(), frames.end());
  frames.erase(std::unique(frames.begin(), frames.end()), frames.end());
  std::string key(reinterpret_cast<const char*>(frames.data()), frames.size() * sizeof(uint32_t));
  const auto [it, inserted] = set_ids_.try_emplace(std::move(key), uint32_t(sets_.size()));
  if (inserted) {
    if (sets_.size() >= kHardMaxSets) too_costly();
    sets_.push_back(frames);
    transitions_.resize(sets_.size() * 256, kUnknown);
  }
  return it->second;
}

uint32_t TokenMasker::set_of(const GrammarMatcher& m) {
  next_.clear();
  for (const GrammarMatcher::Stack& s : m.stacks()) {
    uint32_t f = kEmptyStack;
    for (const uint32_t pos : s) f = intern_frame(pos, f);  // bottom first
    next_.push_back(f);
  }
  std::vector<uint32_t> frames = next_;
  return intern_set(frames);
}

uint32_t TokenMasker::step_uncached(uint32_t set, uint8_t byte) {
  const Grammar& g = *grammar_;
  std::vector<uint32_t> out;
  for (const uint32_t f : sets_[set]) {
    if (f == kEmptyStack) continue;
    const Frame fr = frames_[f];
    if (!g.byte_sets()[g.elements()[fr.pos].value].test(byte)) continue;
    expand(intern_frame(fr.pos + 1, fr.parent), out);
  }
  // intern_set may grow transitions_: write through the index, not the reference.
  const uint32_t result = out.empty() ? kDead : intern_set(out);
  transitions_[size_t(set) * 256 + byte] = result;
  return result;
}

void TokenMasker::compute_mask(uint32_t set, std::vector<uint64_t>& bits) {
  const auto& nodes = trie_->nodes();
  const auto& ids = trie_->token_ids();
  bits.assign((size_t(trie_->n_vocab()) + 63) / 64, 0);
  work_left_ = kMaskWorkBudget;
  walk_sets_.assign(trie_->max_depth() + 1, kDead);
  walk_sets_[0] = set;
  for (size_t i = 0; i < nodes.size();) {
    const auto& node = nodes[i];
    const uint32_t next = step(walk_sets_[node.depth - 1], node.byte);
    if (next == kDead) {
      i = node.end;  // no token below this node is allowed
      continue;
    }
    walk_sets_[node.depth] = next;
    for (uint32_t k = 0; k < node.n_tokens; ++k) {
      const auto id = uint32_t(ids[node.first_token + k]);
      bits[id / 64] |= uint64_t(1) << (id % 64);
    }
    ++i;
  }
  const auto& frames = sets_[set];
  if (std::find(frames.begin(), frames.end(), kEmptyStack) != frames.end())
    for (const int32_t id : trie_->eog_ids()) bits[size_t(id) / 64] |= uint64_t(1) << (id % 64);
}

void TokenMasker::reset_if_large() {
  const size_t mask_bytes = masks_.size() * ((size_t(trie_->n_vocab()) + 63) / 64) * 8;
  if (frames_.size() < kMaxFrames && sets_.size() < kMaxSets && mask_bytes < kMaxMaskBytes) return;
  frames_.clear();
  frame_ids_.clear();
  sets_.clear();
  set_ids_.clear();
  transitions_.clear();
  masks_.clear();
  chosen_.clear();
  last_set_ = kDead;
  ++epoch_;
}

const std::vector<uint64_t>& TokenMasker::mask(const GrammarMatcher& m) {
  reset_if_large();
  const uint32_t set = set_of(m);
  last_set_ = set;
  auto it = masks_.find(set);
  if (it == masks_.end()) {
    std::vector<uint64_t> bits;
    compute_mask(set, bits);
    it = masks_.emplace(set, std::move(bits)).first;
  }
  return it->second;
}

size_t TokenMasker::apply(const GrammarMatcher& m, std::span<const float> logits, std::span<float> out) {
  const std::vector<uint64_t>& bits = mask(m);
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const size_t n = std::min(logits.size(), size_t(trie_->n_vocab()));
  size_t allowed = 0;  // among the ids the row has
  for (size_t w = 0; w * 64 < n; ++w) {
    const size_t valid = std::min<size_t>(64, n - w * 64);
    const uint64_t keep = valid == 64 ? ~uint64_t(0) : (uint64_t(1) << valid) - 1;
    allowed += size_t(__builtin_popcountll(bits[w] & keep));
  }
  if (2 * allowed < n) {
    // Few allowed: fill, then copy the allowed ones.
    std::fill(out.begin(), out.end(), kNegInf);
    for (size_t w = 0; w < bits.size(); ++w)
      for (uint64_t word = bits[w]; word != 0; word &= word - 1) {
        const size_t t = w * 64 + size_t(__builtin_ctzll(word));
        if (t < n) out[t] = logits[t];
      }
  } else {
    // Most allowed: copy, then mask the others.
    std::copy(logits.begin(), logits.end(), out.begin());
    for (size_t w = 0; w * 64 < n; ++w)
      for (uint64_t word = ~bits[w]; word != 0; word &= word - 1) {
        const size_t t = w * 64 + size_t(__builtin_ctzll(word));
        if (t < n) out[t] = kNegInf;
      }
    std::fill(out.begin() + std::ptrdiff_t(n), out.end(), kNegInf);  // padding beyond the vocabulary
  }
  return allowed;
}

bool TokenMasker::allows(const GrammarMatcher& m, int32_t token) {
  if (token < 0 || token >= trie_->n_vocab()) return false;
  const std::vector<uint64_t>& bits = mask(m);
  return (bits[size_t(token) / 64] >> (token % 64)) & 1;
}

bool TokenMasker::accept(GrammarMatcher& m, int32_t token) const {
  if (token < 0 || token >= trie_->n_vocab()) return false;
  const auto& eog = trie_->eog_ids();
  if (std::find(eog.begin(), eog.end(), token) != eog.end()) return m.can_end();
  const std::string& bytes = trie_->bytes(token);
  return !bytes.empty() && m.accept_bytes(bytes);
}

void TokenMasker::record_choice_at(uint64_t epoch, uint32_t state, int32_t token) {
  if (epoch == epoch_ && state != kDead) chosen_[state] = token;
}

void TokenMasker::record_choice(int32_t token) {
  if (last_set_ != kDead) chosen_[last_set_] = token;
}

void TokenMasker::forced_tokens(const GrammarMatcher& m, size_t max_tokens, std::vector<int32_t>& out) {
  if (max_tokens == 0) return;
  GrammarMatcher probe = m;
  std::string forced;
  while (forced.size() < kMaxForcedBytes && !probe.can_end()) {
    const std::bitset<256> next = probe.next_bytes();
    if (next.count() != 1) break;
    size_t b = 0;
    while (!next.test(b)) ++b;
    forced.push_back(static_cast<char>(b));
    probe.accept_byte(uint8_t(b));
  }
  // Token by token: the model's earlier choice at this state where it fits the forced text,
  // else the next token of the text's spelling (spelled again after a remembered choice).
  GrammarMatcher at = m;
  std::string_view rest = forced;
  std::vector<int32_t> spelled;
  size_t next_spelled = 0;
  bool respell = true;
  while (!rest.empty() && max_tokens > 0) {
    int32_t t = -1;
    if (const auto it = chosen_.find(set_of(at)); it != chosen_.end()) {
      const std::string& b = trie_->bytes(it->second);
      if (!b.empty() && rest.substr(0, b.size()) == b) t = it->second;
    }
    if (t >= 0) {
      respell = true;
    } else {
      if (respell) {
        spelled.clear();
        trie_->spell(rest, spelled);
        next_spelled = 0;
        respell = false;
      }
      if (next_spelled == spelled.size()) return;
      t = spelled[next_spelled++];
    }
    out.push_back(t);
    --max_tokens;
    rest.remove_prefix(trie_->bytes(t).size());
    at.accept_bytes(trie_->bytes(t));
  }
  // Everything forced is spelled: if the grammar can only end there, so does the draft.
  if (max_tokens > 0 && rest.empty() && probe.can_end() && probe.next_bytes().none() && !trie_->eog_ids().empty())
    out.push_back(trie_->eog_ids().front());
}

}  // namespace fdl::grammar
