// Helpers for the GPU tests: skipping without a device, host<->device copies, fresh random
// inputs (a new seed per call, printed on failure), and the relative error of METHOD.md.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cuda/cuda_model_factory.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/kernels.h"
#include "flashdllm/dtype.h"

#define FDL_SKIP_WITHOUT_GPU()                                          \
  do {                                                                  \
    std::string fdl_why_;                                               \
    if (!::fdl::cuda::device_available(&fdl_why_))                      \
      GTEST_SKIP() << "no GPU: " << fdl_why_;                           \
  } while (0)

namespace fdl::test {

template <typename T>
cuda::DeviceBuffer<T> to_device(const std::vector<T>& v) {
  cuda::DeviceBuffer<T> d(std::max<size_t>(v.size(), 1));
  FDL_CUDA_CHECK(cudaMemcpy(d.get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

template <typename T>
std::vector<T> to_host(const cuda::DeviceBuffer<T>& d, size_t n) {
  FDL_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<T> v(n);
  FDL_CUDA_CHECK(cudaMemcpy(v.data(), d.get(), n * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}

/// Fills a device buffer with NaN bytes so that unwritten outputs fail the comparison.
template <typename T>
void poison(cuda::DeviceBuffer<T>& d) {
  FDL_CUDA_CHECK(cudaMemset(d.get(), 0xff, d.bytes()));
}

/// A random engine seeded freshly per test (the seed is printed so a failure can be replayed).
inline std::mt19937_64& rng() {
  static std::mt19937_64 r = [] {
    const uint64_t seed = std::random_device{}();
    std::printf("[gpu tests] random seed %llu\n", static_cast<unsigned long long>(seed));
    return std::mt19937_64(seed);
  }();
  return r;
}

inline std::vector<float> random_floats(size_t n, float lo = -1.f, float hi = 1.f) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng());
  return v;
}

/// `count` random weights in [-1, 1) stored as `type` (the bytes of a DeviceMatrix).
inline std::vector<uint8_t> random_weights(cuda::WType type, size_t count) {
  const std::vector<float> v = random_floats(count);
  std::vector<uint8_t> bits(count * cuda::wtype_size(type));
  for (size_t i = 0; i < count; ++i) {
    if (type == cuda::WType::F32) {
      std::memcpy(&bits[4 * i], &v[i], 4);
    } else {
      const uint16_t h = type == cuda::WType::F16 ? fp32_to_fp16(v[i]) : fp32_to_bf16(v[i]);
      std::memcpy(&bits[2 * i], &h, 2);
    }
  }
  return bits;
}

/// v's 16-bit bits in KV dtype `t` (F16 / BF16; rounded to nearest even).
inline uint16_t kv16_bits(KvDtype t, float v) { return t == KvDtype::F16 ? fp32_to_fp16(v) : fp32_to_bf16(v); }
/// v rounded to KV dtype `t` and widened back (F32: v itself).
inline float kv_round(KvDtype t, float v) {
  if (t == KvDtype::F32) return v;
  const uint16_t h = kv16_bits(t, v);
  return t == KvDtype::F16 ? fp16_to_fp32(h) : bf16_to_fp32(h);
}
/// A KV arena (fp32 values) as the bytes of a cache of dtype `t` (the values rounded).
inline std::vector<uint8_t> kv_bytes(KvDtype t, const std::vector<float>& v) {
  std::vector<uint8_t> out(v.size() * kv_dtype_bytes(t));
  for (size_t i = 0; i < v.size(); ++i) {
    if (t == KvDtype::F32) {
      std::memcpy(&out[4 * i], &v[i], 4);
    } else {
      const uint16_t h = kv16_bits(t, v[i]);
      std::memcpy(&out[2 * i], &h, 2);
    }
  }
  return out;
}

/// The values of a cache of dtype `t` from its bytes.
inline std::vector<float> kv_values(KvDtype t, const std::vector<uint8_t>& bytes) {
  std::vector<float> out(bytes.size() / kv_dtype_bytes(t));
  for (size_t i = 0; i < out.size(); ++i) {
    if (t == KvDtype::F32) {
      std::memcpy(&out[i], &bytes[4 * i], 4);
    } else {
      uint16_t h;
      std::memcpy(&h, &bytes[2 * i], 2);
      out[i] = t == KvDtype::F16 ? fp16_to_fp32(h) : bf16_to_fp32(h);
    }
  }
  return out;
}

/// A test-name suffix for an attention shape, e.g. "h32_kv8_d128_bs16" (built with a stream:
/// GCC 12 warns falsely (-Wrestrict) on "literal" + std::string chains).
inline std::string attention_shape_name(int n_head, int n_head_kv, int head_dim, int block_size) {
  std::ostringstream name;
  name << "h" << n_head << "_kv" << n_head_kv << "_d" << head_dim << "_bs" << block_size;
  return name.str();
}

inline std::vector<double> widen(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

/// ‖out − ref‖ / ‖ref‖ (NaN in `out` gives NaN, which fails every bound).
inline double rel_error(const std::vector<float>& out, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = double(out[i]) - ref[i];
    num += d * d;
    den += ref[i] * ref[i];
  }
  return std::sqrt(num) / std::sqrt(den);
}

}  // namespace fdl::test
