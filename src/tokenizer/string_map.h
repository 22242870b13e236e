// Hash map from strings that can be probed with a std::string_view (no temporary strings
// on the tokenizers' hot paths).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>

namespace fdl::tok {

struct StringViewHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};

template <typename V>
using StringMap = std::unordered_map<std::string, V, StringViewHash, std::equal_to<>>;

}  // namespace fdl::tok
