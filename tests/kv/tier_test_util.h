// Helpers for the tiered-KV tests: a small KV shape, deterministic block contents and a
// fresh directory for the disk tier (under the system temp dir, a real disk here, so the
// disk tier runs real O_DIRECT I/O through io_uring).
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "flashdllm/kv_cache.h"
#include "test_support.h"

namespace fdl::test {

// 2 layers * 2 (K,V) * 4 tokens * 3 heads * 60 dims * 4 bytes = 11520 bytes: deliberately
// not a multiple of 4 KiB, so slot rounding and staging for O_DIRECT are exercised.
inline KvShape tier_shape() {
  return KvShape{.n_layer = 2, .n_kv_head = 3, .head_dim = 60, .block_size = 4};
}

inline void fill_block(BlockPool& pool, BlockId b, uint32_t seed) {
  auto bytes = pool.block_bytes(b);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& v : bytes) {
    x = x * 1664525u + 1013904223u;
    v = uint8_t(x >> 24);
  }
}

inline std::vector<uint8_t> block_copy(BlockPool& pool, BlockId b) {
  auto s = pool.block_bytes(b);
  return {s.begin(), s.end()};
}

/// A new empty directory for one test.
inline std::filesystem::path fresh_dir(const std::string& name) {
  static std::atomic<int> n{0};
  auto p = scratch_dir() / (name + "-" + std::to_string(n++));
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p;
}

}  // namespace fdl::test
