#include "tokenizer/string_table.h"

#include <stdexcept>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace fdl::tok {

uint64_t hash_bytes(std::string_view s) { return XXH3_64bits(s.data(), s.size()); }

void StringArena::reserve(size_t n_strings, size_t n_bytes) {
  offsets_.reserve(n_strings + 1);
  bytes_.reserve(n_bytes);
}

void StringArena::push_back(std::string_view s) {
  if (bytes_.size() + s.size() > UINT32_MAX) throw std::length_error("string arena over 4 GiB");
  bytes_.append(s);
  offsets_.push_back(static_cast<uint32_t>(bytes_.size()));
}

StringTable::StringTable(StringArena strings, const std::vector<uint8_t>& present)
    : strings_(std::move(strings)) {
  size_t capacity = 16;
  while (capacity < 2 * strings_.size()) capacity *= 2;
  slots_.assign(capacity, Slot{});
  mask_ = capacity - 1;
  for (size_t i = 0; i < strings_.size(); ++i) {
    if (!present.empty() && !present[i]) continue;
    const std::string_view s = strings_[i];
    const uint64_t h = hash_bytes(s);
    const uint32_t tag = static_cast<uint32_t>(h >> 32);
    for (uint64_t pos = h & mask_;; pos = (pos + 1) & mask_) {
      Slot& slot = slots_[pos];
      if (slot.id < 0) {
        slot = {tag, static_cast<int32_t>(i)};
        break;
      }
      if (slot.hash_tag == tag && strings_[slot.id] == s) {
        slot.id = static_cast<int32_t>(i);  // duplicate text: the later id wins
        break;
      }
    }
  }
}

int32_t StringTable::find(std::string_view s) const {
  if (slots_.empty()) return -1;
  const uint64_t h = hash_bytes(s);
  const uint32_t tag = static_cast<uint32_t>(h >> 32);
  for (uint64_t pos = h & mask_;; pos = (pos + 1) & mask_) {
    const Slot& slot = slots_[pos];
    if (slot.id < 0) return -1;
    if (slot.hash_tag == tag && strings_[slot.id] == s) return slot.id;
  }
}

}  // namespace fdl::tok
