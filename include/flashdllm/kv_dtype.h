// flashdllm/kv_dtype.h — element type of the KV cache's K and V vectors (`--kv-cache-dtype`).
// Plain C++17 (the CUDA kernels include it too). See flashdllm/kv_cache.h for the layout.
#pragma once

#include <cstddef>
#include <cstdint>

namespace fdl {

/// fp32, or IEEE binary16 / bfloat16, rounded to nearest even from the fp32 values the model
/// computes. Thread-safe (constants only).
enum class KvDtype : uint8_t { F32 = 0, F16 = 1, BF16 = 2 };

/// Bytes per element: 4 or 2.
constexpr size_t kv_dtype_bytes(KvDtype t) { return t == KvDtype::F32 ? 4 : 2; }

/// "f32", "f16" or "bf16".
constexpr const char* kv_dtype_name(KvDtype t) {
  return t == KvDtype::F32 ? "f32" : t == KvDtype::F16 ? "f16" : "bf16";
}

}  // namespace fdl
