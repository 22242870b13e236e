// SimHash of a prompt's token 3-grams (see prompt_simhash.h).
#include "engine/prompt_simhash.h"

#include <algorithm>
#include <array>
#include <bit>

#include <xxhash.h>

namespace fdl::engine {

uint64_t prompt_simhash(std::span<const int32_t> tokens) {
  std::array<int32_t, 64> votes{};
  const size_t gram = std::min<size_t>(3, tokens.size());
  if (gram == 0) return 0;
  for (size_t i = 0; i + gram <= tokens.size(); ++i) {
    const uint64_t h = XXH3_64bits(tokens.data() + i, gram * sizeof(int32_t));
    for (int b = 0; b < 64; ++b) votes[size_t(b)] += (h >> b) & 1 ? 1 : -1;
  }
  uint64_t out = 0;
  for (int b = 0; b < 64; ++b)
    if (votes[size_t(b)] > 0) out |= uint64_t(1) << b;
  return out;
}

int simhash_distance(uint64_t a, uint64_t b) { return std::popcount(a ^ b); }

}  // namespace fdl::engine
