// block_checksum: the CPU reference of the device checksum of asynchronous tier copies
// (flashdllm/kv_cache.h).
#include <cstring>

#include "flashdllm/kv_cache.h"
#include "kv/checksum_mix.h"

namespace fdl {

uint64_t block_checksum(std::span<const uint8_t> bytes) {
  const size_t words = bytes.size() / 8;
  uint64_t sum = 0;
  for (size_t i = 0; i < words; ++i) {
    uint64_t w;
    std::memcpy(&w, bytes.data() + i * 8, 8);
    sum += kv::checksum_term(w, i);
  }
  if (const size_t rest = bytes.size() % 8) {
    uint64_t w = 0;
    std::memcpy(&w, bytes.data() + words * 8, rest);
    sum += kv::checksum_term(w, words);
  }
  return kv::checksum_final(sum, bytes.size());
}

}  // namespace fdl
