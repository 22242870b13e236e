// GrammarMatcher: the set of parse stacks after the bytes accepted (flashdllm/grammar.h).
#include <algorithm>

#include "flashdllm/grammar.h"

namespace fdl {
namespace {

constexpr size_t kMaxStacks = GrammarMatcher::kMaxStacks;

void sort_unique(std::vector<GrammarMatcher::Stack>& stacks) {
  std::sort(stacks.begin(), stacks.end());
  stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
  if (stacks.size() > kMaxStacks) stacks.resize(kMaxStacks);
}

}  // namespace

bool GrammarMatcher::expand(const Grammar& g, Stack stack, std::vector<Stack>& out, size_t& budget) {
  bool complete = true;
  const auto& el = g.elements();
  std::vector<Stack> work;
  work.push_back(std::move(stack));
  while (!work.empty()) {
    Stack s = std::move(work.back());
    work.pop_back();
    for (;;) {
      if (s.empty() || el[s.back()].kind == Grammar::Element::Kind::Bytes) {
        out.push_back(std::move(s));
        break;
      }
      if (el[s.back()].kind == Grammar::Element::Kind::End) {
        s.pop_back();  // the alternative is complete: continue with what follows its rule
        continue;
      }
      if (s.size() > kMaxStackDepth || out.size() + work.size() > kMaxStacks || budget == 0) {
        complete = false;
        break;
      }
      --budget;
      const uint32_t pos = s.back();
      const uint32_t rule = el[pos].value;
      // The reference is replaced by its continuation, or dropped when nothing follows it in
      // its alternative (so right recursion does not grow the stack), then by each alternative.
      if (el[pos + 1].kind == Grammar::Element::Kind::End)
        s.pop_back();
      else
        s.back() = pos + 1;
      const auto& alts = g.alternatives(rule);
      for (size_t i = 1; i < alts.size(); ++i) {
        Stack t = s;
        t.push_back(alts[i]);
        work.push_back(std::move(t));
      }
      s.push_back(alts[0]);
    }
  }
  return complete;
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> grammar) : grammar_(std::move(grammar)) {
  size_t budget = kExpandBudget;
  for (const uint32_t alt : grammar_->alternatives(grammar_->root())) expand(*grammar_, Stack{alt}, stacks_, budget);
  sort_unique(stacks_);
}

bool GrammarMatcher::accept_byte(uint8_t byte) {
  const Grammar& g = *grammar_;
  scratch_.clear();
  size_t budget = kExpandBudget;
  for (const Stack& s : stacks_) {
    if (s.empty() || !g.byte_sets()[g.elements()[s.back()].value].test(byte)) continue;
    Stack t = s;
    ++t.back();
    expand(g, std::move(t), scratch_, budget);
  }
  if (scratch_.empty()) return false;
  sort_unique(scratch_);
  stacks_.swap(scratch_);
  return true;
}

bool GrammarMatcher::accept_bytes(std::string_view bytes) {
  if (bytes.empty()) return true;
  std::vector<Stack> saved = stacks_;
  for (const char c : bytes) {
    if (!accept_byte(static_cast<uint8_t>(c))) {
      stacks_ = std::move(saved);
      return false;
    }
  }
  return true;
}

bool GrammarMatcher::can_end() const {
  return std::any_of(stacks_.begin(), stacks_.end(), [](const Stack& s) { return s.empty(); });
}

std::bitset<256> GrammarMatcher::next_bytes() const {
  std::bitset<256> out;
  const Grammar& g = *grammar_;
  for (const Stack& s : stacks_)
    if (!s.empty()) out |= g.byte_sets()[g.elements()[s.back()].value];
  return out;
}

}  // namespace fdl
