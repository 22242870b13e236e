// slot_allocator.h — fixed-capacity allocator of slot indices [0, capacity) for a tier store.
//
// LIFO free list (recently freed slots are reused first, which keeps a disk tier's hot set
// at the front of its files) and a used bitmap so a double free is caught instead of
// silently handing one slot to two blocks. Invariant: n_free() + n_used() == capacity().
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace fdl::kv {

class SlotAllocator {
 public:
  explicit SlotAllocator(size_t capacity) : used_(capacity, 0) {
    free_.reserve(capacity);
    for (size_t i = capacity; i-- > 0;) free_.push_back(uint32_t(i));
  }
  size_t capacity() const { return used_.size(); }
  size_t n_free() const { return free_.size(); }
  size_t n_used() const { return used_.size() - free_.size(); }

  /// A free slot, or nullopt when the store is full (never throws for "full").
  std::optional<uint32_t> allocate() {
    if (free_.empty()) return std::nullopt;
    const uint32_t s = free_.back();
    free_.pop_back();
    used_[s] = 1;
    return s;
  }
  /// Throws std::invalid_argument for an out-of-range or already free slot.
  void release(uint32_t slot) {
    if (slot >= used_.size() || !used_[slot])
      throw std::invalid_argument("SlotAllocator: slot " + std::to_string(slot) +
                                  " is not allocated");
    used_[slot] = 0;
    free_.push_back(slot);
  }
  bool is_used(uint32_t slot) const { return slot < used_.size() && used_[slot]; }

 private:
  std::vector<uint8_t> used_;
  std::vector<uint32_t> free_;
};

}  // namespace fdl::kv
