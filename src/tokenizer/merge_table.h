// Open-addressing table of BPE merge rules keyed by the (left id, right id) pair of vocab
// entries, giving the rule's rank and the id of the merged entry. Built once per vocab; the
// hot loop then merges without hashing any strings.
#pragma once

#include <cstdint>
#include <vector>

namespace fdl::tok {

class MergeTable {
 public:
  struct Rule {
    int32_t rank = -1;       ///< -1: no rule for this pair
    int32_t merged_id = -1;  ///< vocab id of left+right, -1 if that text is not an entry
  };

  explicit MergeTable(size_t expected_rules = 0) {
    size_t capacity = 16;
    while (capacity < 2 * expected_rules) capacity *= 2;
    slots_.assign(capacity, Slot{});
    mask_ = capacity - 1;
  }

  /// Add a rule unless the pair already has one (the first occurrence of a rule counts).
  void add(int32_t left, int32_t right, Rule rule) {
    if (2 * (size_ + 1) > slots_.size()) grow();
    Slot& s = probe(key(left, right));
    if (s.key == kEmpty) {
      s = {key(left, right), rule};
      ++size_;
    }
  }

  Rule find(int32_t left, int32_t right) const {
    const uint64_t k = key(left, right);
    for (uint64_t pos = mix(k) & mask_;; pos = (pos + 1) & mask_) {
      const Slot& s = slots_[pos];
      if (s.key == k) return s.rule;
      if (s.key == kEmpty) return {};
    }
  }

  size_t size() const { return size_; }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};  // ids are >= 0, so never a real key
  struct Slot {
    uint64_t key = kEmpty;
    Rule rule;
  };

  static uint64_t key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  static uint64_t mix(uint64_t k) {  // splitmix64 finaliser: spreads sequential ids
    k ^= k >> 30;
    k *= 0xbf58476d1ce4e5b9ull;
    k ^= k >> 27;
    k *= 0x94d049bb133111ebull;
    return k ^ (k >> 31);
  }
  Slot& probe(uint64_t k) {
    for (uint64_t pos = mix(k) & mask_;; pos = (pos + 1) & mask_) {
      Slot& s = slots_[pos];
      if (s.key == k || s.key == kEmpty) return s;
    }
  }
  void grow() {
    std::vector<Slot> old;
    old.swap(slots_);
    slots_.assign(old.size() * 2, Slot{});
    mask_ = slots_.size() - 1;
    for (const Slot& s : old)
      if (s.key != kEmpty) probe(s.key) = s;
  }

  std::vector<Slot> slots_;
  uint64_t mask_ = 0;
  size_t size_ = 0;
};

}  // namespace fdl::tok
