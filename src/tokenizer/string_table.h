// Immutable tables of byte strings for the tokenizers' hot paths.
//
// StringArena: many strings in one buffer, addressed by index (cheap to build for 100k+
// entries, no per-string allocation, safe to move).
// StringTable: a StringArena plus an open-addressing index (XXH3-64 hashes, linear probing,
// load factor <= 1/2) answering "which id has exactly this text?".
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace fdl::tok {

class StringArena {
 public:
  void reserve(size_t n_strings, size_t n_bytes);
  /// Append a string; its index is the number of strings before it.
  void push_back(std::string_view s);
  size_t size() const { return offsets_.size() - 1; }
  std::string_view operator[](size_t i) const {
    return std::string_view(bytes_.data() + offsets_[i], offsets_[i + 1] - offsets_[i]);
  }

 private:
  std::string bytes_;
  std::vector<uint32_t> offsets_{0};
};

class StringTable {
 public:
  StringTable() = default;
  /// Index `strings[i]` as id i for every i with `present[i]` (all when `present` is empty).
  /// When several ids have the same text, the last one wins (as llama.cpp's map does).
  StringTable(StringArena strings, const std::vector<uint8_t>& present = {});

  /// Id whose text equals `s`, or -1.
  int32_t find(std::string_view s) const;
  /// Text of id `i` (empty for ids that were not indexed).
  std::string_view text(int32_t i) const { return strings_[static_cast<size_t>(i)]; }
  size_t size() const { return strings_.size(); }

 private:
  struct Slot {
    uint32_t hash_tag = 0;  // upper hash bits, to skip most string compares
    int32_t id = -1;        // -1: empty slot
  };
  StringArena strings_;
  std::vector<Slot> slots_;
  uint64_t mask_ = 0;
};

/// Hash of a byte string used by the tables (XXH3-64).
uint64_t hash_bytes(std::string_view s);

}  // namespace fdl::tok
